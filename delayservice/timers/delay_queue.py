"""DelayQueue: a binary min-heap guarded by a condition variable, as in the JDK.

In CPython the C `heapq` beats any pure-Python wheel on insert, so the heap is
`make_scheduler`'s default; the wheels win on cancel.
Cancel is lazy: the entry is flagged and skipped when it surfaces, and the heap is
rebuilt once more than half of it is cancelled so memory stays proportional to live
items.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from delayservice.clock import Clock
from delayservice.timers.base import DEFAULT_CLOCK

T = TypeVar("T")


class DelayEntry(Generic[T]):
    __slots__ = ("cancelled", "due", "fired", "item")

    def __init__(self, item: T, due: float) -> None:
        self.item = item
        self.due = due
        self.cancelled = False
        self.fired = False


Row = tuple[float, int, T, "DelayEntry[T] | None"]
"""(due, arrival, item, handle): only `schedule` makes a handle (for `cancel`); the
batch path keeps none, which saves an object per buffered record."""


def _cancelled(row: Row[T]) -> bool:
    return row[3] is not None and row[3].cancelled


class DelayQueue(Generic[T]):
    def __init__(self, clock: Clock = DEFAULT_CLOCK) -> None:
        self._clock = clock
        self._heap: list[Row[T]] = []
        self._seq = itertools.count()
        self._cancelled = 0
        self._cond = threading.Condition(threading.Lock())
        self._woken = False
        self._closed = False

    # -- producers -----------------------------------------------------------------
    def schedule(self, item: T, due: float) -> DelayEntry[T]:
        entry = DelayEntry(item, due)
        with self._cond:
            head_before = self._heap[0][0] if self._heap else None
            heapq.heappush(self._heap, (due, next(self._seq), item, entry))
            if head_before is None or due < head_before:
                self._cond.notify()
        return entry

    put = schedule

    def schedule_many(self, items: list[tuple[T, float]]) -> None:
        if not items:
            return
        push, seq, heap = heapq.heappush, self._seq, self._heap
        with self._cond:
            head_before = heap[0][0] if heap else None
            earliest = min(due for _item, due in items)
            for item, due in items:
                push(heap, (due, next(seq), item, None))
            if head_before is None or earliest < head_before:
                self._cond.notify()

    def cancel(self, handle: DelayEntry[T]) -> bool:
        with self._cond:
            if handle.cancelled or handle.fired:
                return False
            handle.cancelled = True
            self._cancelled += 1
            if self._cancelled * 2 > len(self._heap):
                self._compact()
            return True

    # -- the consumer --------------------------------------------------------------
    def take_expired(self, timeout: float | None = None) -> list[T]:
        with self._cond:
            now = self._await_due(timeout)
            return [] if now is None else self._pop_due(now)

    def wait_due(self, timeout: float | None = None) -> None:
        with self._cond:
            self._await_due(timeout)

    def take(self) -> T:
        """Block until the head is due and return it alone (JDK `take`)."""
        while True:
            with self._cond:
                self._drop_cancelled_head()
                now = self._clock()
                if self._heap and self._heap[0][0] <= now:
                    return self._pop_one()
                wait = self._heap[0][0] - now if self._heap else None
                self._cond.wait(wait)

    def poll(self, timeout: float = 0.0) -> T | None:
        """The head if it is due within `timeout` seconds, else None (JDK `poll`)."""
        with self._cond:
            deadline = self._clock() + timeout
            while True:
                self._drop_cancelled_head()
                now = self._clock()
                if self._heap and self._heap[0][0] <= now:
                    return self._pop_one()
                if now >= deadline:
                    return None
                wait = deadline - now
                if self._heap:
                    wait = min(wait, self._heap[0][0] - now)
                self._cond.wait(wait)

    def wakeup(self) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    # -- bookkeeping ---------------------------------------------------------------
    def remove_where(self, predicate: Callable[[T], bool]) -> list[T]:
        with self._cond:
            removed: list[T] = []
            kept: list[Row[T]] = []
            for row in self._heap:
                if _cancelled(row):
                    continue
                if predicate(row[2]):
                    removed.append(row[2])
                    if row[3] is not None:
                        row[3].cancelled = True
                else:
                    kept.append(row)
            heapq.heapify(kept)
            self._heap = kept
            self._cancelled = 0
            self._cond.notify_all()
            return removed

    def next_due(self) -> float | None:
        with self._cond:
            self._drop_cancelled_head()
            return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        with self._cond:
            return len(self._heap) - self._cancelled

    def close(self) -> list[T]:
        with self._cond:
            self._closed = True
            rows = sorted(self._heap, key=lambda row: row[:2])
            rest = [row[2] for row in rows if not _cancelled(row)]
            self._heap.clear()
            self._cancelled = 0
            self._cond.notify_all()
            return rest

    # -- internals (lock held) -----------------------------------------------------
    def _await_due(self, timeout: float | None) -> float | None:
        """Wait until the head is due and return the clock reading then, or None once
        `timeout` passes or `wakeup` is called."""
        deadline = None if timeout is None else self._clock() + timeout
        while True:
            self._drop_cancelled_head()
            now = self._clock()
            if self._heap and self._heap[0][0] <= now:
                return now
            if self._woken or self._closed:
                self._woken = False
                return None
            wait = None if deadline is None else deadline - now
            if self._heap:
                head_wait = self._heap[0][0] - now
                wait = head_wait if wait is None else min(wait, head_wait)
            if wait is not None and wait <= 0:
                return None
            self._cond.wait(wait)

    def _drop_cancelled_head(self) -> None:
        while self._heap and _cancelled(self._heap[0]):
            heapq.heappop(self._heap)
            self._cancelled -= 1

    def _pop_one(self) -> T:
        row = heapq.heappop(self._heap)
        if row[3] is not None:
            row[3].fired = True
        return row[2]

    def _pop_due(self, now: float, limit: int | None = None) -> list[T]:
        out: list[T] = []
        heap = self._heap
        while heap and heap[0][0] <= now and (limit is None or len(out) < limit):
            row = heapq.heappop(heap)
            entry = row[3]
            if entry is not None:
                if entry.cancelled:
                    self._cancelled -= 1
                    continue
                entry.fired = True
            out.append(row[2])
        return out

    def _compact(self) -> None:
        self._heap = [row for row in self._heap if not _cancelled(row)]
        heapq.heapify(self._heap)
        self._cancelled = 0
