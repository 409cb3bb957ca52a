"""Kafka's hierarchical timing wheel (`TimingWheel`, `TimerTaskList`, `TimerTaskEntry`).

Time here is integer milliseconds, as in Kafka: integers keep bucket arithmetic exact,
so a task lands in the bucket its expiration names and never one tick early. Callers
with float seconds convert at the edge (see `system_timer` and `wheel_scheduler`).

The wheel itself only files and removes tasks in O(1). It never ticks: every bucket
that gains its first task for a round is handed to a `DelayQueue` of buckets, and the
owner sleeps on that queue until the earliest bucket is due, then calls
`advance_clock` with that bucket's expiration and `flush`es it. Flushed tasks are
added again, which demotes them to a finer wheel or reports them as expired.

Nothing here is locked; the owner (`SystemTimer`, `WheelScheduler`) holds its lock
around every call, which is Kafka's read-write lock collapsed to one lock because the
GIL already serialises the O(1) operations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

NO_EXPIRATION = -1
"""A bucket's expiration while it holds no round (Kafka's -1)."""


class BucketQueue(Protocol):
    """Where a bucket goes when it gains a round: Kafka's `DelayQueue<TimerTaskList>`."""

    def schedule(self, item: TimerTaskList, due: float) -> object: ...


class TimerTaskEntry:
    """One task's place in a bucket: a doubly linked node with a back-pointer to its list.

    The back-pointer is what makes cancel O(1): the entry unlinks itself from whatever
    bucket currently holds it, without searching. `task` is whatever the owner files:
    a `TimerTask` for `SystemTimer`, the scheduled item for `WheelScheduler`.
    """

    __slots__ = ("expiration_ms", "list", "next", "prev", "task")

    # Set by TimerTaskList.add before anything reads them; not set here to keep
    # creating an entry (once per scheduled task) cheap.
    next: TimerTaskEntry
    prev: TimerTaskEntry

    def __init__(self, task: object, expiration_ms: int) -> None:
        self.task = task
        self.expiration_ms = expiration_ms
        self.list: TimerTaskList | None = None

    def remove(self) -> bool:
        """Unlink from the current bucket; False when the entry is in none (fired, cancelled)."""
        bucket = self.list
        if bucket is None:
            return False
        bucket.remove(self)
        return True


class TimerTaskList:
    """A bucket: a circular doubly linked list with a sentinel, plus its round's expiration.

    The sentinel removes every empty-list and end-of-list branch from add and remove.
    `expiration_ms` is set when the bucket gains its first task for a round and reset
    by `flush`, so the bucket enters the delay queue once per round, not once per task.
    """

    __slots__ = ("expiration_ms", "root")

    def __init__(self) -> None:
        root = TimerTaskEntry(None, NO_EXPIRATION)
        root.next = root
        root.prev = root
        self.root = root
        self.expiration_ms = NO_EXPIRATION

    def add(self, entry: TimerTaskEntry) -> None:
        root = self.root
        tail = root.prev
        entry.next = root
        entry.prev = tail
        entry.list = self
        tail.next = entry
        root.prev = entry

    def remove(self, entry: TimerTaskEntry) -> None:
        if entry.list is not self:
            return
        after = entry.next
        before = entry.prev
        after.prev = before
        before.next = after
        # Drop the links so a held, cancelled handle does not keep the bucket alive.
        entry.next = entry.prev = entry
        entry.list = None

    def set_expiration(self, expiration_ms: int) -> bool:
        """Record this round's expiration; True when it changed, i.e. the bucket must be queued."""
        if self.expiration_ms == expiration_ms:
            return False
        self.expiration_ms = expiration_ms
        return True

    def flush(self, reinsert: Callable[[TimerTaskEntry], None]) -> None:
        """Empty the bucket and hand every entry, oldest first, to `reinsert`.

        The whole chain is detached at once instead of unlinking entry by entry as
        Kafka does: `reinsert` never files into the bucket being flushed (its round
        has passed), so walking the detached chain is safe and saves two writes a task.
        """
        root = self.root
        entry = root.next
        root.next = root
        root.prev = root
        self.expiration_ms = NO_EXPIRATION
        while entry is not root:
            following = entry.next
            entry.list = None
            reinsert(entry)
            entry = following

    def remove_where(self, predicate: Callable[[TimerTaskEntry], bool]) -> list[TimerTaskEntry]:
        removed = [entry for entry in self if predicate(entry)]
        for entry in removed:
            self.remove(entry)
        return removed

    def clear(self) -> list[TimerTaskEntry]:
        """Unlink everything without reinserting (shutdown); the entries, oldest first."""
        entries = list(self)
        for entry in entries:
            entry.list = None
            entry.next = entry.prev = entry
        root = self.root
        root.next = root.prev = root
        self.expiration_ms = NO_EXPIRATION
        return entries

    def __iter__(self) -> Iterator[TimerTaskEntry]:
        root = self.root
        entry = root.next
        while entry is not root:
            following = entry.next
            yield entry
            entry = following

    def __bool__(self) -> bool:
        return self.root.next is not self.root


class TimingWheel:
    """One level of the hierarchy: `wheel_size` buckets of `tick_ms` each.

    A level covers [current_time_ms, current_time_ms + interval_ms). A task beyond that
    goes to the overflow wheel, created on first need with tick = this level's interval,
    so the hierarchy grows only as far as the longest delay asks. Bucket due times go to
    `queue` as seconds (expiration_ms / 1000) because queues run on the package's
    seconds clock.
    """

    __slots__ = (
        "buckets",
        "current_time_ms",
        "interval_ms",
        "overflow_wheel",
        "queue",
        "tick_ms",
        "wheel_size",
    )

    def __init__(self, tick_ms: int, wheel_size: int, start_ms: int, queue: BucketQueue) -> None:
        if tick_ms < 1 or wheel_size < 2:
            raise ValueError(
                f"tick_ms must be >= 1 and wheel_size >= 2, got {tick_ms}, {wheel_size}"
            )
        self.tick_ms = tick_ms
        self.wheel_size = wheel_size
        self.interval_ms = tick_ms * wheel_size
        self.queue = queue
        self.buckets = [TimerTaskList() for _ in range(wheel_size)]
        # The hand always rests on a tick boundary.
        self.current_time_ms = start_ms - (start_ms % tick_ms)
        self.overflow_wheel: TimingWheel | None = None

    def add(self, entry: TimerTaskEntry) -> bool:
        """File `entry`; False when it is already expired (the caller fires it).

        Kafka recurses into the overflow wheel; a loop does the same without a Python
        call per level. Only the lowest level can report expiry: a higher level's hand
        never runs ahead of the lowest one.
        """
        expiration = entry.expiration_ms
        wheel = self
        while True:
            current = wheel.current_time_ms
            tick = wheel.tick_ms
            if expiration < current + tick:
                return False
            if expiration < current + wheel.interval_ms:
                virtual_id = expiration // tick
                bucket = wheel.buckets[virtual_id % wheel.wheel_size]
                bucket.add(entry)
                # First task of this bucket's round: the delay queue must learn of it.
                if bucket.set_expiration(virtual_id * tick):
                    wheel.queue.schedule(bucket, bucket.expiration_ms / 1000)
                return True
            overflow = wheel.overflow_wheel
            if overflow is None:
                overflow = wheel.overflow_wheel = TimingWheel(
                    wheel.interval_ms, wheel.wheel_size, current, wheel.queue
                )
            wheel = overflow

    def advance_clock(self, time_ms: int) -> None:
        """Move the hands of this level and every coarser one that a whole tick has passed."""
        wheel: TimingWheel | None = self
        while wheel is not None and time_ms >= wheel.current_time_ms + wheel.tick_ms:
            wheel.current_time_ms = time_ms - (time_ms % wheel.tick_ms)
            time_ms = wheel.current_time_ms
            wheel = wheel.overflow_wheel

    def levels(self) -> Iterator[TimingWheel]:
        wheel: TimingWheel | None = self
        while wheel is not None:
            yield wheel
            wheel = wheel.overflow_wheel

    def non_empty_buckets(self) -> Iterator[TimerTaskList]:
        for wheel in self.levels():
            yield from (bucket for bucket in wheel.buckets if bucket)
