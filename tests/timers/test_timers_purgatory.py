"""Kafka's DelayedOperationPurgatory: completion by event or by timeout, exactly once."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayservice.timers.purgatory import DelayedOperation, DelayedOperationPurgatory
from delayservice.timers.system_timer import SystemTimer


class Op(DelayedOperation):
    """Completes once `ready` holds; records how it ended."""

    def __init__(self, name, delay_ms, ready, clock, log):
        super().__init__(delay_ms)
        self.name, self.ready, self.clock, self.log = name, ready, clock, log

    def try_complete(self):
        return self.ready(self) and self.force_complete()

    def on_complete(self):
        self.log.append(("complete", self.name, self.clock()))

    def on_expiration(self):
        self.log.append(("expire", self.name, self.clock()))


def purgatory_on(clock, executor, purge_interval=1000):
    timer = SystemTimer("p", tick_ms=1, wheel_size=20, clock_ms=clock, executor=executor)
    return DelayedOperationPurgatory(
        "test", timer, purge_interval=purge_interval, reaper_enabled=False
    )


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(
                st.just("watch"),
                st.tuples(st.integers(0, 3000), st.sets(st.integers(0, 4), min_size=1)),
            ),
            st.tuples(st.just("event"), st.integers(0, 4)),
            st.tuples(st.just("advance"), st.integers(0, 800)),
        ),
        max_size=50,
    )
)
def test_each_operation_completes_once_by_event_or_by_its_deadline(
    steps, new_sim_clock_ms, new_inline_executor
):
    clock = new_sim_clock_ms()
    log = []
    satisfied = set()  # keys whose condition now holds
    purgatory = purgatory_on(clock, new_inline_executor(), purge_interval=3)
    ops = {}
    for i, (step, arg) in enumerate(steps):
        if step == "watch":
            delay, keys = arg
            op = Op(i, delay, lambda o, keys=keys: bool(keys & satisfied), clock, log)
            ops[i] = (clock() + delay, op)
            done = purgatory.try_complete_else_watch(op, sorted(keys))
            assert done == bool(keys & satisfied)
        elif step == "event":
            satisfied.add(arg)
            purgatory.check_and_complete(arg)
        else:
            clock.now += arg
            purgatory.advance_clock(0)
            for deadline, op in ops.values():
                # Tick 1 ms: by now every operation past its deadline has ended.
                assert op.is_completed or deadline > clock()
        assert purgatory.num_delayed == sum(not op.is_completed for _, op in ops.values())
    completions = Counter(name for kind, name, _ in log if kind == "complete")
    assert all(count == 1 for count in completions.values())
    for kind, name, at in log:
        if kind == "expire":
            assert at >= ops[name][0], "expired before its deadline"
            assert ("complete", name, at) in log
    pending = purgatory.shutdown()
    assert {op.name for op in pending} == {n for n, (_, op) in ops.items() if not op.is_completed}


def test_purge_drops_completed_operations_left_under_other_keys(
    new_sim_clock_ms, new_inline_executor
):
    clock = new_sim_clock_ms()
    log = []
    done = set()
    purgatory = purgatory_on(clock, new_inline_executor(), purge_interval=2)
    for i in range(4):
        op = Op(i, 10_000, lambda o: o.name in done, clock, log)
        assert not purgatory.try_complete_else_watch(op, ["a", "b"])
    assert purgatory.watched == 8
    done.update(range(4))
    assert purgatory.check_and_complete("a") == 4
    assert purgatory.watched == 4  # still listed under "b"
    purgatory.advance_clock(0)  # estimate 4 - delayed 0 > 2: purge
    assert purgatory.watched == 0
    assert purgatory.check_and_complete("b") == 0


def test_an_operation_that_can_complete_at_once_is_never_watched(
    new_sim_clock_ms, new_inline_executor
):
    clock = new_sim_clock_ms()
    log = []
    purgatory = purgatory_on(clock, new_inline_executor())
    assert purgatory.try_complete_else_watch(Op(1, 100, lambda o: True, clock, log), ["k"])
    assert purgatory.watched == 0
    assert purgatory.num_delayed == 0
    with pytest.raises(ValueError, match="empty"):
        purgatory.try_complete_else_watch(Op(2, 100, lambda o: False, clock, log), [])


def test_cancel_for_key_hands_back_uncompleted_operations(new_sim_clock_ms, new_inline_executor):
    clock = new_sim_clock_ms()
    log = []
    purgatory = purgatory_on(clock, new_inline_executor())
    op = Op(1, 5, lambda o: False, clock, log)
    purgatory.try_complete_else_watch(op, ["k"])
    assert purgatory.cancel_for_key("k") == [op]
    clock.now += 10
    purgatory.advance_clock(0)
    assert log == []
    assert purgatory.num_delayed == 0


def test_force_complete_runs_once_under_racing_events_and_expiry(wait_until):
    """Real threads: four event threads and the reaper race for 300 short operations."""
    log = []
    lock = threading.Lock()

    class Racy(Op):
        def on_complete(self):
            with lock:
                log.append(("complete", self.name, 0))

        def on_expiration(self):
            with lock:
                log.append(("expire", self.name, 0))

    purgatory = DelayedOperationPurgatory("race", purge_interval=10)
    go = threading.Event()
    ops = [Racy(i, i % 4, lambda o: go.is_set(), time.monotonic, log) for i in range(300)]
    for op in ops:
        purgatory.try_complete_else_watch(op, [op.name % 3, "all"])

    def events():
        go.wait()
        for _ in range(20):
            for key in (0, 1, 2, "all"):
                purgatory.check_and_complete(key)

    threads = [threading.Thread(target=events, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    go.set()
    for thread in threads:
        thread.join()
    assert wait_until(lambda: all(op.is_completed for op in ops))
    assert purgatory.shutdown() == []
    with lock:
        completions = Counter(name for kind, name, _ in log if kind == "complete")
        expirations = {name for kind, name, _ in log if kind == "expire"}
    assert sorted(completions) == list(range(300))
    assert set(completions.values()) == {1}
    assert expirations <= set(completions)


def test_shutdown_returns_operations_still_waiting(wait_until):
    log = []
    purgatory = DelayedOperationPurgatory("stop")
    waiting = [Op(i, 60_000, lambda o: False, time.monotonic, log) for i in range(3)]
    for op in waiting:
        purgatory.try_complete_else_watch(op, ["k"])
    quick = Op("quick", 1, lambda o: False, time.monotonic, log)
    purgatory.try_complete_else_watch(quick, ["k"])
    assert wait_until(lambda: quick.is_completed)
    assert purgatory.shutdown() == waiting
    assert [(kind, name) for kind, name, _ in log] == [("complete", "quick"), ("expire", "quick")]
