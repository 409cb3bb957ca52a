"""Netty's HashedWheelTimer: turned by hand on a simulated clock, then by its worker."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayservice.timers.errors import TimerClosedError, TimerRejectedError, TimerStateError
from delayservice.timers.hashed_wheel import HashedWheelTimer
from delayservice.timers.hashed_wheel_scheduler import HashedWheelScheduler

TICK = 0.01


def manual_timer(clock, **kwargs):
    kwargs.setdefault("ticks_per_wheel", 8)
    return HashedWheelTimer(TICK, clock=clock, start_worker=False, **kwargs)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    steps=st.lists(
        st.one_of(
            # Up to ~5 turns of an 8-slot wheel: remaining rounds > 0.
            st.tuples(st.just("add"), st.floats(0.0, 0.45)),
            st.tuples(st.just("cancel"), st.integers(0, 1000)),
            st.tuples(st.just("advance"), st.one_of(st.floats(0, 0.004), st.floats(0, 0.2))),
        ),
        max_size=60,
    )
)
def test_every_timeout_fires_once_never_early_at_most_one_tick_late(steps, new_sim_clock):
    clock = new_sim_clock()
    timer = manual_timer(clock)
    fired = []
    live = {}  # name -> (due, timeout)
    cancelled = set()
    for i, (op, arg) in enumerate(steps):
        if op == "add":
            due = clock() + arg
            live[i] = (due, timer.new_timeout(lambda t, i=i: fired.append((i, clock())), arg))
        elif op == "cancel" and live:
            name = sorted(live)[arg % len(live)]
            _, timeout = live.pop(name)
            assert timeout.cancel()
            assert timeout.cancelled
            assert not timeout.cancel()
            cancelled.add(name)
        elif op == "advance":
            clock.advance(arg)
            timer.advance()
            for name, at in fired:
                if name in live:
                    due, _ = live.pop(name)
                    assert at >= due, "fired early"
            # A timeout due a full tick ago has had its tick boundary processed.
            assert all(due > clock() - TICK for due, _ in live.values())
    # Cancelled timeouts stay counted until the worker's next tick processes them.
    assert timer.pending_timeouts == len(live) + len(timer._cancelled_timeouts)
    names = [name for name, _ in fired]
    assert len(names) == len(set(names))
    assert not cancelled & set(names)
    unprocessed = timer.stop()
    assert sorted(id(t) for t in unprocessed) == sorted(id(t) for _, t in live.values())
    assert all(t.cancelled for t in unprocessed)


def test_a_timeout_beyond_one_turn_waits_its_rounds(new_sim_clock):
    clock = new_sim_clock()
    timer = manual_timer(clock)  # 8 ticks of 10 ms: one turn is 80 ms
    fired = []
    start = clock()
    timeout = timer.new_timeout(lambda t: fired.append(clock() - start), 0.205)  # tick 20
    rounds_seen = {}
    while clock() - start < 0.3:
        clock.advance(0.001)
        timer.advance()
        if timeout.bucket is not None:  # transferred from the pending queue, not yet fired
            rounds_seen.setdefault(timeout.remaining_rounds, timeout.bucket)
    # Tick 20 is slot 4 two turns on: the hand passed slot 4 twice, counting down.
    slot = timer._wheel[4]
    assert rounds_seen == {2: slot, 1: slot, 0: slot}
    assert len(fired) == 1
    assert 0.205 <= fired[0] <= 0.205 + TICK + 0.001


def test_max_pending_timeouts_rejects_with_a_retriable_error(new_sim_clock):
    clock = new_sim_clock()
    timer = manual_timer(clock, max_pending_timeouts=2)
    timer.new_timeout(lambda t: None, 0.01)
    timer.new_timeout(lambda t: None, 0.5)
    with pytest.raises(TimerRejectedError) as caught:
        timer.new_timeout(lambda t: None, 0.01)
    assert caught.value.retriable
    clock.advance(0.03)
    timer.advance()  # the first fired: room for one more
    timer.new_timeout(lambda t: None, 0.01)


def test_stop_returns_unprocessed_and_refuses_new_timeouts(new_sim_clock):
    clock = new_sim_clock()
    timer = manual_timer(clock)
    keep = timer.new_timeout(lambda t: None, 5.0)
    gone = timer.new_timeout(lambda t: None, 5.0)
    gone.cancel()
    assert timer.stop() == [keep]
    with pytest.raises(TimerClosedError):
        timer.new_timeout(lambda t: None, 0.1)
    assert HashedWheelTimer(start_worker=False).stop() == []  # never started


def test_worker_fires_on_its_own_and_stop_loses_nothing(wait_until):
    timer = HashedWheelTimer(0.002, 64, name="hwt-test")
    fired = []
    start = time.monotonic()
    for delay in (0.005, 0.010, 0.020):
        timer.new_timeout(lambda t, d=delay: fired.append((d, time.monotonic() - start)), delay)
    far = [timer.new_timeout(lambda t: fired.append(("far", 0)), 60.0) for _ in range(3)]
    assert wait_until(lambda: len(fired) == 3)
    assert all(elapsed >= delay for delay, elapsed in fired)
    assert sorted(timer.stop(), key=id) == sorted(far, key=id)
    assert len(fired) == 3


def test_stop_from_a_timer_task_is_refused(wait_until):
    timer = HashedWheelTimer(0.002)
    errors = []

    def stop_inside(_timeout):
        try:
            timer.stop()
        except TimerStateError as exc:
            errors.append(exc)

    timer.new_timeout(stop_inside, 0.0)
    assert wait_until(lambda: errors)
    timer.stop()


def test_scheduler_adapter_hands_out_in_order_and_accounts_for_everything(wait_until):
    scheduler = HashedWheelScheduler(tick_duration=0.002)
    now = time.monotonic()
    handles = {name: scheduler.schedule(name, now + d) for name, d in [("b", 0.02), ("a", 0.01)]}
    scheduler.schedule("c", now + 0.02)
    scheduler.schedule("drop", now + 0.015)
    scheduler.schedule("later", now + 60)
    assert scheduler.cancel(handles["a"])
    assert not scheduler.cancel(handles["a"])
    assert scheduler.remove_where(lambda item: item == "drop") == ["drop"]
    assert scheduler.next_due() == pytest.approx(now + 0.02)
    got = []
    assert wait_until(lambda: got.extend(scheduler.take_expired(0.05)) or len(got) >= 2)
    assert got == ["b", "c"]
    assert time.monotonic() >= now + 0.02
    assert len(scheduler) == 1
    taker = threading.Thread(target=lambda: got.append(scheduler.take_expired(None)), daemon=True)
    taker.start()
    scheduler.wakeup()
    taker.join(5)
    assert not taker.is_alive()
    assert got[-1] == []
    assert scheduler.close() == ["later"]
    with pytest.raises(TimerClosedError):
        scheduler.schedule("x", now)
