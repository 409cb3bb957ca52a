"""Kafka's TimingWheel + SystemTimer: the source's worked examples, then properties."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayservice.timers.delay_queue import DelayQueue
from delayservice.timers.errors import TimerClosedError
from delayservice.timers.system_timer import SystemTimer, TimerTask
from delayservice.timers.timing_wheel import TimerTaskEntry, TimerTaskList, TimingWheel


class Recorder(TimerTask):
    def __init__(self, name, delay_ms, clock, log):
        super().__init__(delay_ms)
        self.name, self.clock, self.log = name, clock, log

    def run(self):
        self.log.append((self.name, self.clock(), threading.current_thread().name))


def make_timer(clock, executor, wheel_size=20):
    return SystemTimer("test", tick_ms=1, wheel_size=wheel_size, clock_ms=clock, executor=executor)


def test_450ms_task_is_demoted_twice_as_in_the_source(new_sim_clock_ms, new_inline_executor):
    clock = new_sim_clock_ms()
    clock.now = 0
    ran = []
    timer = make_timer(clock, new_inline_executor())
    timer.add(Recorder("t450", 450, clock, ran))
    timer.add(Recorder("t28", 28, clock, ran))
    # Overflow wheels exist only because the delays asked for them: 1, 20, 400 ms ticks.
    assert [wheel.tick_ms for wheel in timer._wheel.levels()] == [1, 20, 400]
    # Only due buckets wake the reaper: 20 (t28 demoted), 28 (fires), 400, 440, 450.
    processed = []
    for now in range(0, 460):
        clock.now = now
        if timer.advance_clock(0):
            processed.append(now)
    assert processed == [20, 28, 400, 440, 450]
    assert [(name, at) for name, at, _ in ran] == [("t28", 28), ("t450", 450)]
    assert timer.size == 0


def timer_with_one_task(clock, executor, delay_ms):
    ran = []
    timer = make_timer(clock, executor)
    task = Recorder("x", delay_ms, clock, ran)
    timer.add(task)
    return timer, task, ran


def test_cancel_unlinks_through_the_back_pointer(new_sim_clock_ms, new_inline_executor):
    clock = new_sim_clock_ms()
    timer, task, ran = timer_with_one_task(clock, new_inline_executor(), 5)
    entry = task._entry
    bucket = entry.list
    assert timer.size == 1
    assert bucket
    assert task.cancel()
    assert entry.list is None
    assert not bucket
    assert timer.size == 0
    assert not task.cancel()
    clock.now += 10
    timer.advance_clock(0)  # the emptied bucket is still queued; it flushes nothing
    assert ran == []


def test_re_adding_a_task_moves_it(new_sim_clock_ms, new_inline_executor):
    clock = new_sim_clock_ms()
    timer, task, ran = timer_with_one_task(clock, new_inline_executor(), 5)
    task.delay_ms = 50
    timer.add(task)
    assert timer.size == 1
    clock.now += 10
    timer.advance_clock(0)
    assert ran == []
    clock.now += 40
    timer.advance_clock(0)
    assert [name for name, _, _ in ran] == ["x"]


def test_expired_tasks_run_on_the_executor_not_the_reaper(new_sim_clock_ms, wait_until):
    clock = new_sim_clock_ms()
    ran = []
    with ThreadPoolExecutor(1, thread_name_prefix="timer-exec") as executor:
        timer = make_timer(clock, executor)
        timer.add(Recorder("x", 5, clock, ran))
        timer.add(Recorder("now", 0, clock, ran))  # already due: runs at once, also off-thread
        clock.now += 5
        assert timer.advance_clock(0)
        assert wait_until(lambda: len(ran) == 2)
    assert all(thread.startswith("timer-exec") for _, _, thread in ran)


def test_shutdown_returns_what_never_ran_and_refuses_new_tasks(
    new_sim_clock_ms, new_inline_executor
):
    clock = new_sim_clock_ms()
    ran = []
    timer = make_timer(clock, new_inline_executor())
    tasks = [Recorder(f"t{d}", d, clock, ran) for d in (900, 3, 40_000, 70)]
    for task in tasks:
        timer.add(task)
    clock.now += 3
    timer.advance_clock(0)
    assert [task.name for task in timer.shutdown()] == ["t70", "t900", "t40000"]
    assert [name for name, _, _ in ran] == ["t3"]
    with pytest.raises(TimerClosedError):
        timer.add(Recorder("late", 1, clock, ran))


def test_a_failing_task_does_not_stop_the_timer(new_sim_clock_ms, new_inline_executor, caplog):
    class Boom(TimerTask):
        def run(self):
            raise RuntimeError("boom")

    clock = new_sim_clock_ms()
    ran = []
    timer = make_timer(clock, new_inline_executor())
    timer.add(Boom(1))
    timer.add(Recorder("after", 2, clock, ran))
    clock.now += 2
    timer.advance_clock(0)
    assert [name for name, _, _ in ran] == ["after"]
    assert "boom" in caplog.text


def test_timing_wheel_rejects_a_degenerate_shape():
    with pytest.raises(ValueError, match="wheel_size"):
        TimingWheel(1, 1, 0, DelayQueue())


def test_bucket_round_expiration_is_set_once_per_round():
    bucket = TimerTaskList()
    assert bucket.set_expiration(20)
    assert not bucket.set_expiration(20)
    entries = [TimerTaskEntry(i, 20) for i in range(3)]
    for entry in entries:
        bucket.add(entry)
    seen = []
    bucket.flush(lambda entry: seen.append(entry.task))
    assert seen == [0, 1, 2]
    assert not bucket
    assert bucket.set_expiration(40)  # a new round: queued again


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    wheel_size=st.sampled_from([2, 8, 20]),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.one_of(st.integers(0, 50), st.integers(0, 200_000))),
            st.tuples(st.just("cancel"), st.integers(0, 1000)),
            st.tuples(st.just("advance"), st.one_of(st.integers(0, 30), st.integers(0, 90_000))),
        ),
        max_size=60,
    ),
)
def test_every_task_runs_once_on_its_millisecond(
    wheel_size, steps, new_sim_clock_ms, new_inline_executor
):
    clock = new_sim_clock_ms()
    ran = []
    timer = make_timer(clock, new_inline_executor(), wheel_size)
    live = {}  # name -> (expiration_ms, task)
    cancelled = set()
    for i, (op, arg) in enumerate(steps):
        if op == "add":
            task = Recorder(i, arg, clock, ran)
            live[i] = (clock() + arg, task)
            timer.add(task)
        elif op == "cancel" and live:
            name = sorted(live)[arg % len(live)]
            _, task = live.pop(name)
            if task.cancel():
                cancelled.add(name)
            else:  # it had already run (delay 0)
                assert name in {n for n, _, _ in ran}
        elif op == "advance":
            clock.now += arg
            timer.advance_clock(0)
        for name, at, _ in ran:
            expiration, _ = live.pop(name, (None, None))
            if expiration is not None:
                assert at >= expiration, "ran before its expiration"
        if op == "advance":
            # Tick 1 ms: after the reaper's pass nothing due by now may still wait. (An
            # add between passes may file a due task; its bucket wakes the next pass.)
            assert all(expiration > clock() for expiration, _ in live.values())
        assert timer.size == len(live)
    names = [name for name, _, _ in ran]
    assert len(names) == len(set(names)), "a task ran twice"
    assert not cancelled & set(names), "a cancelled task ran"
