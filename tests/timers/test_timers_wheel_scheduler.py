"""The wheel Scheduler's own edges: ordering across demotion, and the never-early guard."""

from __future__ import annotations

import itertools
import math
import threading

from delayservice.timers.wheel_scheduler import WheelScheduler


def test_same_due_keeps_scheduling_order_across_a_demotion(new_sim_clock):
    clock = new_sim_clock()
    scheduler = WheelScheduler(clock, tick_ms=1, wheel_size=4)
    due = clock() + 0.010
    scheduler.schedule("first", due)  # beyond the 4 ms wheel: an overflow bucket
    clock.advance(0.008)
    assert scheduler.take_expired(0) == []  # first is demoted to the 1 ms wheel
    scheduler.schedule("second", due)  # filed straight into the same bucket... after it?
    scheduler.schedule("zeroth", due - 0.0001)
    clock.advance(0.002)
    assert scheduler.take_expired(0) == ["zeroth", "first", "second"]


def test_the_guard_holds_an_item_its_bucket_would_release_early(new_sim_clock):
    due = 1_700_000_004.4720001  # the float ceil(due * 1000) / 1000 lands *below* due
    bucket_due = math.ceil(due * 1000) / 1000
    assert bucket_due < due
    clock = new_sim_clock()
    scheduler = WheelScheduler(clock)
    scheduler.schedule("x", due)
    clock.now = bucket_due
    assert scheduler.take_expired(0) == []  # the bucket is due, the item is not
    assert len(scheduler) == 1
    assert scheduler.next_due() == due
    clock.now = due
    assert scheduler.take_expired(0) == ["x"]


def test_a_held_item_falling_due_mid_take_does_not_spin(new_sim_clock):
    """Regression: a held item re-filed while the take was still draining buckets was
    found due again and again against the `now` read at the start of the take."""
    due = 1_700_000_004.4720001
    clock = new_sim_clock()
    scheduler = WheelScheduler(clock)
    scheduler.schedule("x", due)
    clock.now = math.ceil(due * 1000) / 1000
    reads = itertools.count()

    def creeping():  # every read of the clock moves it on by a tenth of a microsecond
        return clock.now + next(reads) * 1e-7

    scheduler._clock = creeping
    got = []
    taker = threading.Thread(target=lambda: got.extend(scheduler.take_expired(1)), daemon=True)
    taker.start()
    taker.join(5)
    assert not taker.is_alive(), "the take spun on the held item"
    assert got == ["x"]
