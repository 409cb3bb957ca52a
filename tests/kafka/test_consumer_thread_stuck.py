"""Readiness sees a consumer thread that is alive but no longer moving: one turn of its
loop (here a read that never returns within its timeout) lasting past the limit."""

from __future__ import annotations

import threading
from typing import Any

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
