"""The `Scheduler` that `make_scheduler("wheel", clock)` returns.

It runs Kafka's hierarchical `TimingWheel` the way `SystemTimer` does, minus the
executor: the taking thread is the reaper. Buckets that gain a round go on a heap
ordered by expiration, and the taker sleeps on a condition until the heap's head is
due. So it never ticks an empty bucket and never polls; an item that files into a
bucket earlier than the head makes that bucket the new head, which wakes the taker.

The heap is plain `heapq` under the scheduler's one lock rather than `DelayQueue`
(which `SystemTimer` uses, as Kafka does): a bucket round then costs two heap
operations instead of two more lock round trips and a handle, which is what kept a
sparse wheel (about one item per 1 ms bucket) slower than the heap it should beat.

Time: due times are float seconds on the injected clock. The wheel files each item
under `ceil(due / tick) * tick` integer milliseconds, so the wheel's own decision is
never early, and a last guard compares the exact float due with `clock()` before an
item leaves; the rare item the guard holds back (float rounding at the ms boundary)
waits in a ready list that is itself on the heap at its exact due time.

Precision: an item is returned no earlier than its due time and, when a taker is
waiting, at most one tick (1 ms by default) plus thread wake-up latency after it.
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
import threading
from collections.abc import Callable
from math import ceil
from typing import Any, Generic, TypeVar, cast

from delayservice.clock import Clock
from delayservice.timers.base import TimerHandle
from delayservice.timers.errors import TimerClosedError
from delayservice.timers.timing_wheel import (
    NO_EXPIRATION,
    TimerTaskEntry,
    TimerTaskList,
    TimingWheel,
)

T = TypeVar("T")

_by_due = operator.attrgetter("due")
_by_due_seq = operator.attrgetter("due", "seq")


class WheelEntry(TimerTaskEntry):
    """The handle `schedule` returns: the wheel entry itself, so cancel is one unlink."""

    __slots__ = ("cancelled", "due", "seq")

    def __init__(self, item: object, due: float, seq: int, expiration_ms: int) -> None:
        self.task = item
        self.expiration_ms = expiration_ms
        self.list = None
        self.due = due
        self.seq = seq
        self.cancelled = False


class _BucketHeap:
    """Buckets by due time (seconds); the wheel's `queue`. Caller holds `cond`."""

    __slots__ = ("cond", "heap", "seq")

    def __init__(self, cond: threading.Condition) -> None:
        self.cond = cond
        self.heap: list[tuple[float, int, TimerTaskList]] = []
        self.seq = itertools.count()

    def schedule(self, bucket: TimerTaskList, due: float) -> None:
        heap = self.heap
        row = (due, next(self.seq), bucket)
        heapq.heappush(heap, row)
        if heap[0] is row:
            self.cond.notify()  # the taker may be sleeping until a later head


def _sort_due_order(entries: list[WheelEntry]) -> None:
    """Order by (due, scheduling order) without building a tuple per entry when possible.

    Expired entries come out bucket by bucket, so they are already grouped by
    millisecond; a stable sort by due alone is cheap on such input and is enough
    unless two equal dues left their buckets out of scheduling order (a demoted
    entry meeting one filed directly), which the check below catches.
    """
    entries.sort(key=_by_due)
    keys = list(map(_by_due_seq, entries))
    if not all(map(operator.lt, keys, itertools.islice(keys, 1, None))):
        entries.sort(key=_by_due_seq)


class WheelScheduler(Generic[T]):
    """Hierarchical timing wheel behind the `Scheduler` protocol.

    Thread-safe for any number of scheduling threads and one taking thread. `next_due`
    scans only buckets that can hold the earliest item but is O(n) in the worst case;
    keep it off hot paths.
    """

    def __init__(self, clock: Clock, tick_ms: int = 1, wheel_size: int = 512) -> None:
        self._clock = clock
        self._tick_ms = tick_ms
        self._ticks_per_second = 1000 / tick_ms
        self._cond = threading.Condition(threading.Lock())
        self._buckets = _BucketHeap(self._cond)
        self._wheel = TimingWheel(tick_ms, wheel_size, math.floor(clock() * 1000), self._buckets)
        # Items the wheel calls expired but whose exact due is still ahead (or that
        # were scheduled already due); on the heap at the earliest such due.
        self._ready = TimerTaskList()
        self._ready_due = math.inf
        self._seq = itertools.count()
        self._size = 0
        self._woken = False
        self._closed = False

    # -- producers -----------------------------------------------------------------
    def schedule(self, item: T, due: float) -> WheelEntry:
        entry = WheelEntry(
            item, due, next(self._seq), ceil(due * self._ticks_per_second) * self._tick_ms
        )
        # acquire/release rather than `with`: half the cost on CPython 3.11 (~70 vs
        # ~150 ns), which matters on the two per-task paths, schedule and cancel.
        cond = self._cond
        cond.acquire()
        try:
            if self._closed:
                raise TimerClosedError("the wheel scheduler")
            if not self._wheel.add(entry):
                self._add_ready(entry)
            self._size += 1
        finally:
            cond.release()
        return entry

    def schedule_many(self, items: list[tuple[T, float]]) -> None:
        """`schedule` for a consumer batch: entries built outside the lock, filed under it once."""
        per_second, tick_ms, seq = self._ticks_per_second, self._tick_ms, self._seq
        entries = [
            WheelEntry(item, due, next(seq), ceil(due * per_second) * tick_ms)
            for item, due in items
        ]
        with self._cond:
            if self._closed:
                raise TimerClosedError("the wheel scheduler")
            add = self._wheel.add
            for entry in entries:
                if not add(entry):
                    self._add_ready(entry)
            self._size += len(entries)

    def cancel(self, handle: TimerHandle) -> bool:
        if not isinstance(handle, WheelEntry):
            return False
        cond = self._cond
        cond.acquire()
        try:
            bucket = handle.list
            if bucket is None:
                return False
            # The bucket stays on the heap even if this empties it; its round then
            # flushes nothing, as in Kafka.
            bucket.remove(handle)
            handle.cancelled = True
            self._size -= 1
            return True
        finally:
            cond.release()

    # -- the taker -----------------------------------------------------------------
    def take_expired(self, timeout: float | None = None) -> list[T]:
        with self._cond:
            deadline = None if timeout is None else self._clock() + timeout
            while (now := self._await_due(deadline)) is not None:
                items = self._expire(now)
                if items:
                    return items
                # only demotions or emptied buckets: wait for the new head
            return []

    def wait_due(self, timeout: float | None = None) -> None:
        with self._cond:
            # A due bucket (or held item) ends the wait; take_expired sorts out the rest.
            self._await_due(None if timeout is None else self._clock() + timeout)

    def _await_due(self, deadline: float | None) -> float | None:
        """Lock held. Wait until the head bucket is due and return the clock reading
        then, or None once `deadline` passes or `wakeup` is called."""
        clock = self._clock
        heap = self._buckets.heap
        while True:
            now = clock()
            if heap and heap[0][0] <= now:
                return now
            if self._woken or self._closed:
                self._woken = False
                return None
            wait = _wait_time(heap[0][0] if heap else None, deadline, now)
            if wait is None or wait > 0:
                self._cond.wait(wait)
            else:
                return None  # the caller's deadline

    def wakeup(self) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    # -- rebalance, inspection, shutdown ------------------------------------------
    def remove_where(self, predicate: Callable[[T], bool]) -> list[T]:
        def matches(entry: TimerTaskEntry) -> bool:
            return bool(predicate(cast(T, entry.task)))

        removed: list[WheelEntry] = []
        with self._cond:
            for bucket in [*self._wheel.non_empty_buckets(), self._ready]:
                for entry in bucket.remove_where(matches):
                    removed.append(_as_entry(entry))
                    removed[-1].cancelled = True
            self._size -= len(removed)
        _sort_due_order(removed)
        return cast("list[T]", [entry.task for entry in removed])

    def next_due(self) -> float | None:
        with self._cond:
            best = min((_as_entry(e).due for e in self._ready), default=math.inf)
            # Every entry of a bucket is due after (expiration - one tick of its level);
            # visiting buckets by that bound lets the scan stop early.
            candidates = sorted(
                (bucket.expiration_ms - wheel.tick_ms, id(bucket), bucket)
                for wheel in self._wheel.levels()
                for bucket in wheel.buckets
                if bucket
            )
            for bound_ms, _, bucket in candidates:
                if bound_ms / 1000 > best:
                    break
                bucket_best = min(_as_entry(e).due for e in bucket)
                best = min(best, bucket_best)
        return None if best == math.inf else best

    def __len__(self) -> int:
        return self._size

    def close(self) -> list[T]:
        with self._cond:
            self._closed = True
            rest = [_as_entry(e) for b in self._wheel.non_empty_buckets() for e in b.clear()]
            rest.extend(_as_entry(e) for e in self._ready.clear())
            self._buckets.heap.clear()
            self._size = 0
            self._cond.notify_all()
        _sort_due_order(rest)
        return cast("list[T]", [entry.task for entry in rest])

    # -- internals (lock held) -----------------------------------------------------
    def _expire(self, now: float) -> list[Any]:
        """Advance through every bucket due by `now`, as Kafka's reaper does.

        Returns the items due by `now`, in (due, scheduling order). Demotions may file
        into buckets that are already due; the loop takes those too. Buckets come out
        in expiration order, so the items mostly arrive in order already: the loop
        checks that as it goes and sorts only when it saw a step backwards.
        """
        heap = self._buckets.heap
        heappop = heapq.heappop
        add = self._wheel.add
        advance = self._wheel.advance_clock
        ready = self._ready
        entries: list[Any] = []
        keep = entries.append
        items: list[Any] = []
        keep_item = items.append
        held: list[WheelEntry] = []
        hold = held.append
        last_due = -math.inf
        last_seq = -1
        in_order = True
        while heap and heap[0][0] <= now:
            bucket = heappop(heap)[2]
            if bucket is ready:
                self._ready_due = math.inf
            else:
                advance(bucket.expiration_ms)
            root = bucket.root
            entry: Any = root.next
            root.next = root.prev = root
            bucket.expiration_ms = NO_EXPIRATION
            # TimerTaskList.flush inlined: one Python call less per task on the hot path.
            while entry is not root:
                following = entry.next
                entry.list = None
                if not add(entry):
                    due = entry.due
                    if due > now:
                        hold(entry)  # the never-early guard
                    else:
                        if due < last_due or (due == last_due and entry.seq < last_seq):
                            in_order = False
                        last_due = due
                        last_seq = entry.seq
                        keep(entry)
                        keep_item(entry.task)
                entry = following
        for entry in held:
            self._add_ready(entry)
        self._size -= len(entries)
        if not in_order:
            entries.sort(key=_by_due_seq)
            items = [entry.task for entry in entries]
        return items

    def _add_ready(self, entry: WheelEntry) -> None:
        self._ready.add(entry)
        # The heap keeps a row for the earliest ready due; later rows are redundant
        # (the ready list flushes whole), so only an earlier due needs a new one.
        if entry.due < self._ready_due:
            self._ready_due = entry.due
            self._buckets.schedule(self._ready, entry.due)


def _wait_time(head: float | None, deadline: float | None, now: float) -> float | None:
    """Seconds to sleep: until the head bucket or the caller's deadline, whichever is first."""
    until = [t for t in (head, deadline) if t is not None]
    return min(until) - now if until else None


def _as_entry(entry: TimerTaskEntry) -> WheelEntry:
    assert isinstance(entry, WheelEntry)
    return entry
