"""make_scheduler on the real clock, used the way the daemon uses it.

One thread schedules (the consumer), one takes (the forwarder). Waits poll a condition
under a deadline; the only sleeping is inside the scheduler under test.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from delayservice.timers.errors import TimerClosedError
from delayservice.timers.factory import make_scheduler

KINDS = ["heap", "wheel"]


class Taker:
    """The forwarder's side: one thread in take_expired, recording what and when."""

    def __init__(self, scheduler, timeout=None):
        self.batches = []
        self.thread = threading.Thread(
            target=lambda: self.batches.append((scheduler.take_expired(timeout), time.time())),
            daemon=True,  # a failed test must not leave the process waiting on it
        )
        self.thread.start()


@pytest.mark.parametrize("kind", KINDS)
def test_an_earlier_item_wakes_a_blocked_take(kind, wait_until):
    scheduler = make_scheduler(kind, time.time)
    start = time.time()
    scheduler.schedule("late", start + 30)
    taker = Taker(scheduler)
    # The taker is asleep until the late item; an earlier one must cut that short.
    scheduler.schedule("early", start + 0.05)
    assert wait_until(lambda: taker.batches, timeout=10)
    items, at = taker.batches[0]
    assert items == ["early"]
    assert start + 0.05 <= at < start + 5
    assert len(scheduler) == 1
    scheduler.close()


@pytest.mark.parametrize("kind", KINDS)
def test_wakeup_releases_a_blocked_take_with_nothing(kind, wait_until):
    scheduler = make_scheduler(kind, time.time)
    scheduler.schedule("far", time.time() + 60)
    taker = Taker(scheduler)
    assert not wait_until(lambda: taker.batches, timeout=0.05)  # really blocked
    scheduler.wakeup()
    taker.thread.join(5)
    assert taker.batches[0][0] == []
    assert len(scheduler) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_remove_where_takes_items_out_for_good(kind):
    scheduler = make_scheduler(kind, time.time)
    now = time.time()
    for i in range(10):
        scheduler.schedule(i, now + 0.01 * (i % 3))
    assert sorted(scheduler.remove_where(lambda i: i % 2 == 1)) == [1, 3, 5, 7, 9]
    assert len(scheduler) == 5
    got = []
    deadline = time.time() + 5
    while len(got) < 5 and time.time() < deadline:
        got.extend(scheduler.take_expired(0.1))
    assert sorted(got) == [0, 2, 4, 6, 8]
    assert scheduler.take_expired(0) == []
    assert len(scheduler) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_timeout_returns_empty_without_waiting_for_far_items(kind):
    scheduler = make_scheduler(kind, time.time)
    scheduler.schedule("far", time.time() + 60)
    started = time.monotonic()
    assert scheduler.take_expired(0.05) == []
    assert 0.04 <= time.monotonic() - started < 2


@pytest.mark.parametrize("kind", KINDS)
def test_one_producer_one_consumer_never_early_nothing_lost(kind, wait_until):
    """The daemon's shape: epoch-second dues in ms steps, many ties, a consumer thread."""
    scheduler = make_scheduler(kind, time.time)
    rnd = random.Random(7)
    count = 3000
    dues = {}
    received = []
    problems = []
    stop = threading.Event()

    def consume():
        while not stop.is_set():
            batch = scheduler.take_expired(None)
            now = time.time()
            keys = [(dues[i], i) for i in batch]
            if keys != sorted(keys):
                problems.append(("out of (due, scheduling) order", keys))
            problems.extend(("early", key, now) for key in keys if key[0] > now)
            received.extend(batch)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    base_ms = int(time.time() * 1000)
    for i in range(count):
        dues[i] = (base_ms + rnd.randrange(0, 300)) / 1000  # ms grain, like due_ms / 1000
        scheduler.schedule(i, dues[i])
    assert wait_until(lambda: len(received) == count, timeout=20)
    stop.set()
    scheduler.wakeup()
    consumer.join(5)
    assert problems == []
    assert sorted(received) == list(range(count))


def test_the_wheel_refuses_work_after_close():
    scheduler = make_scheduler("wheel", time.time)
    scheduler.schedule("x", time.time() + 60)
    assert scheduler.close() == ["x"]
    with pytest.raises(TimerClosedError):
        scheduler.schedule("y", time.time())


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown scheduler kind"):
        make_scheduler("list", time.time)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", KINDS)
def test_wait_due_returns_when_an_item_is_due_and_leaves_it_to_take(kind, wait_until):
    scheduler = make_scheduler(kind, time.time)
    start = time.time()
    scheduler.schedule("late", start + 30)
    returned = []
    waiter = threading.Thread(
        target=lambda: (scheduler.wait_due(None), returned.append(time.time())), daemon=True
    )
    waiter.start()
    scheduler.schedule("soon", start + 0.05)  # earlier than the head: must wake the waiter
    assert wait_until(lambda: returned)
    assert returned[0] >= start + 0.05
    assert scheduler.take_expired(0) == ["soon"]
    assert len(scheduler) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_wait_due_honours_timeout_and_wakeup(kind, wait_until):
    scheduler = make_scheduler(kind, time.time)
    scheduler.schedule("late", time.time() + 30)
    start = time.monotonic()
    scheduler.wait_due(0.05)
    assert time.monotonic() - start >= 0.04
    returned = []
    waiter = threading.Thread(
        target=lambda: (scheduler.wait_due(None), returned.append(1)), daemon=True
    )
    waiter.start()
    scheduler.wakeup()
    assert wait_until(lambda: returned)
    assert len(scheduler) == 1
