"""Property tests for the two `Scheduler`s the daemon can pick, on a simulated clock.

Random sequences of schedule / cancel / remove_where / clock advances; after every
advance the scheduler must hand out exactly the items its precision promises: none
before its due time, none twice, none cancelled, each batch in (due, scheduling order),
and nothing left behind that was due more than one tick ago.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayservice.timers.delay_queue import DelayQueue
from delayservice.timers.wheel_scheduler import WheelScheduler

SLACK = 1e-6  # float rounding of due * 1000 at the millisecond boundary

offsets = st.one_of(
    st.floats(-2.0, 2.0),  # past due or due within a few wheel turns
    st.floats(0.0, 900.0),  # reaches the overflow wheels
    st.integers(-1000, 300_000).map(lambda ms: ms / 1000),  # ms-grained, with ties
)
EDGES = (-0.0004, -1e-7, 0.0, 1e-7, 0.0009)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("schedule"), offsets),
        st.tuples(st.just("cancel"), st.integers(0, 10_000)),
        st.tuples(st.just("remove"), st.integers(2, 7)),
        st.tuples(st.just("advance"), st.one_of(st.floats(0.0, 0.01), st.floats(0.0, 400.0))),
        # Move the clock to just before, at, or just after a pending item's due time,
        # where an early or a late hand-out would show.
        st.tuples(st.just("edge"), st.tuples(st.integers(0, 10_000), st.sampled_from(EDGES))),
    ),
    max_size=80,
)

# (factory, precision in seconds): how late past due an item may still be pending.
DESIGNS = {
    "heap": (DelayQueue, 0.0),
    "wheel": (WheelScheduler, 0.001),
    "wheel-tiny": (lambda clock: WheelScheduler(clock, tick_ms=1, wheel_size=4), 0.001),
    "wheel-5ms": (lambda clock: WheelScheduler(clock, tick_ms=5, wheel_size=8), 0.005),
}


class Model:
    """What the scheduler should hold, next to the scheduler itself."""

    def __init__(self, scheduler, clock, precision):
        self.scheduler = scheduler
        self.clock = clock
        self.precision = precision
        self.live = {}  # seq -> (due, handle)
        self.gone = set()  # fired, cancelled or removed
        self.seq = 0

    def schedule(self, offset):
        due = self.clock() + offset
        self.live[self.seq] = (due, self.scheduler.schedule(self.seq, due))
        self.seq += 1

    def cancel(self, pick):
        if not self.live:
            return
        key = sorted(self.live)[pick % len(self.live)]
        _, handle = self.live.pop(key)
        assert self.scheduler.cancel(handle)
        assert handle.cancelled
        assert not self.scheduler.cancel(handle)
        self.gone.add(key)

    def remove(self, modulus):
        removed = self.scheduler.remove_where(lambda item: item % modulus == 0)
        expected = sorted((due, key) for key, (due, _) in self.live.items() if key % modulus == 0)
        assert removed == [key for _, key in expected]
        for key in removed:
            del self.live[key]
            self.gone.add(key)

    def edge(self, arg):
        pick, delta = arg
        if self.live:
            due, _ = self.live[sorted(self.live)[pick % len(self.live)]]
            self.clock.now = max(self.clock.now, due + delta)
        self.take()

    def take(self):
        out = self.scheduler.take_expired(0)
        now = self.clock()
        order = []
        for key in out:
            assert key not in self.gone, f"{key} fired twice or after cancel"
            due, _ = self.live.pop(key)
            assert due <= now, f"{key} fired early: due {due}, now {now}"
            order.append((due, key))
            self.gone.add(key)
        assert order == sorted(order), "a batch must be in (due, scheduling order)"
        late = [key for key, (due, _) in self.live.items() if due <= now - self.precision - SLACK]
        assert not late, f"due more than one tick ago but still pending: {late}"

    def check_size(self):
        assert len(self.scheduler) == len(self.live)
        expected = min((due for due, _ in self.live.values()), default=None)
        assert self.scheduler.next_due() == expected


@pytest.mark.parametrize("design", sorted(DESIGNS))
@settings(max_examples=60, deadline=None, derandomize=True)
@given(steps=ops)
def test_every_item_fires_once_never_early_within_precision(design, steps, new_sim_clock):
    factory, precision = DESIGNS[design]
    clock = new_sim_clock()
    model = Model(factory(clock), clock, precision)
    for op, arg in steps:
        if op == "advance":
            clock.advance(arg)
            model.take()
        else:
            getattr(model, op)(arg)
        model.check_size()
    # Run out the clock: everything still pending must come out, exactly once.
    while model.live:
        clock.advance(60.0)
        model.take()
    assert model.scheduler.take_expired(0) == []
    assert len(model.scheduler) == 0


@pytest.mark.parametrize("design", sorted(DESIGNS))
def test_close_returns_every_unfired_item_in_due_order(design, new_sim_clock):
    factory, _ = DESIGNS[design]
    clock = new_sim_clock()
    scheduler = factory(clock)
    dues = [5.0, 0.5, 700.0, 0.5, 30.0]
    handles = [scheduler.schedule(i, clock() + due) for i, due in enumerate(dues)]
    scheduler.cancel(handles[4])
    clock.advance(1.0)
    assert scheduler.take_expired(0) == [1, 3]
    assert scheduler.close() == [0, 2]
    assert scheduler.take_expired(0) == []
