"""Readiness sees a consumer thread that is alive but no longer moving: one turn of its
loop (here a read that never returns within its timeout) lasting past the limit, or
every turn failing for as long."""

from __future__ import annotations

import threading
from typing import Any

from delayservice.kafka.consumer_thread import ERROR_PAUSE_S
from tests.level.fakes import make_level_rig, wait_for
from tests.level.test_consumer_loop import subscribed


def test_a_read_that_never_returns_makes_the_consumer_thread_stuck_and_then_not() -> None:
    rig = subscribed(make_level_rig())
    released = threading.Event()
    entered = threading.Event()
    real_consume = rig.consumer.consume

    def consume(num_messages: int = 1, timeout: float = -1) -> Any:
        entered.set()
        released.wait(30)  # a call that never returns within its timeout
        return real_consume(num_messages, 0)

    rig.consumer.consume = consume  # type: ignore[method-assign]
    rig.loop.start()
    try:
        wait_for(entered.is_set, "the read to start")
        assert rig.loop.stuck(60.0) is None  # not yet past the limit
        wait_for(lambda: rig.loop.stuck(0.2) is not None, "readiness to see it stuck")
        why = rig.loop.stuck(0.2)
        assert why is not None
        assert "one turn of the consumer thread has lasted" in why
        released.set()
        rig.consumer.consume = real_consume  # type: ignore[method-assign]
        wait_for(lambda: rig.loop.stuck(0.2) is None, "the thread to move again")
    finally:
        released.set()
        rig.loop.request_stop()
        assert rig.loop.join(5.0)
    assert rig.loop.stuck(0.0) is None  # a stopped thread is reported as stopped, not stuck


def test_a_thread_whose_every_turn_fails_is_stuck_until_a_turn_succeeds() -> None:
    """Each failed turn goes back to what it had not made safe, so a thread whose every
    turn raises (a client callback that always fails) beats but reads nothing new. The
    reason repeats a bounded part of the exception's text: /readyz answers in one line."""
    rig = subscribed(make_level_rig())
    failing = threading.Event()
    failing.set()
    failed = threading.Event()
    real_consume = rig.consumer.consume

    def consume(num_messages: int = 1, timeout: float = -1) -> Any:
        if failing.is_set():
            failed.set()
            raise RuntimeError("a logging filter failed " + "x" * 100_000)
        return real_consume(num_messages, timeout)

    rig.consumer.consume = consume  # type: ignore[method-assign]
    rig.loop.start()
    try:
        wait_for(failed.is_set, "a turn to fail")
        assert rig.loop.stuck(60.0) is None  # not yet past the limit
        # Past the pause after each failed turn (ERROR_PAUSE_S), which a turn lasts.
        limit = 2 * ERROR_PAUSE_S
        wait_for(lambda: rig.loop.stuck(limit) is not None, "readiness to see it failing")
        why = rig.loop.stuck(limit)
        assert why is not None
        assert "every turn of the consumer thread has failed for" in why
        assert "a logging filter failed" in why
        assert "more characters" in why
        assert len(why) < 500  # one readable line, however long the client's message
        failing.clear()
        wait_for(lambda: rig.loop.stuck(limit) is None, "a turn to succeed")
    finally:
        failing.clear()
        rig.loop.request_stop()
        assert rig.loop.join(5.0)
