"""The forwarder's buffer in precise mode (`forward.buffer.Buffer`): records in memory,
taken in fire-time order.

Records arrive in runs (a loaded slice of a slot, an intake batch, records put back)
and are held that way: a heap of runs keyed by each run's earliest record not yet
taken, every run sorted by fire time. A burst due at one instant then costs a heap
operation per run and a slice per take, not a heap push and pop per record: with
235,000 records held, popping them one by one took 28 % of the forwarder's time, and
a tuple per record about 75 bytes more than a run's two list slots.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
from bisect import bisect_right
from collections.abc import Callable
from operator import itemgetter
from typing import Final

from delayservice.clock import Clock
from delayservice.forward.buffer import NEVER, TP, Alarm, Runs
from delayservice.precise.storage.slot_record import SlotRecord

_FIRE: Final = itemgetter(1)


class _Run:
    """Records sorted by fire time; those before `start` are taken."""

    __slots__ = ("fires", "records", "start")

    def __init__(self, records: list[SlotRecord], fires: list[float]) -> None:
        self.records = records
        self.fires = fires
        self.start = 0

    def compact(self) -> None:
        """Let go of taken records once they are half the run (amortised O(1))."""
        if self.start * 2 >= len(self.records):
            del self.records[: self.start]
            del self.fires[: self.start]
            self.start = 0


class SlotBuffer:
    """Its taker (`keep`) drops what must not go out any more: cancelled since it was
    loaded, or a replica's copy the owner reported done. Nothing is taken while its
    gate (`hold_until`) is shut: a cancel may still be unread behind the records a
    restart reads first; and nothing that fires after the intake's read-through
    limit (`read_through`): a cancel may still be unread after a stall."""

    def __init__(
        self,
        clock: Clock,
        keep: Callable[[list[SlotRecord]], list[SlotRecord]] = lambda records: records,
        *,
        topic: str = "",
    ) -> None:
        """`topic`: the precise topic whose records it holds (its runs' key)."""
        self.topic = topic
        self._clock = clock
        self._keep = keep
        self._heap: list[tuple[float, int, _Run]] = []
        self._seq = itertools.count()
        self._size = 0
        self._cond = threading.Condition(threading.Lock())
        self._alarm = Alarm(self._cond, clock)
        self._gate: threading.Event | None = None
        self._limit: Callable[[], float] = lambda: NEVER

    def hold_until(self, gate: threading.Event) -> None:
        """Take nothing until `gate` is set; whoever sets it calls `wake`. Records due
        meanwhile wait in place, looked at once when it opens, not once per retry."""
        self._gate = gate

    def read_through(self, limit_s: Callable[[], float]) -> None:
        """Take only what fires by `limit_s()` (clock seconds); whoever moves the limit
        calls `limit_moved`."""
        self._limit = limit_s

    def limit_moved(self, old_s: float, new_s: float) -> None:
        """Wake the taker if the earliest record waited for this move."""
        with self._cond:
            if self._heap and old_s < self._heap[0][0] <= new_s:
                self._alarm.wake_locked()

    def _shut(self) -> bool:
        gate = self._gate
        return gate is not None and not gate.is_set()

    def schedule_many(self, items: list[tuple[SlotRecord, float]]) -> None:
        """Hold `items`, (record, fire time in clock seconds) each, as one run."""
        if not items:
            return
        ordered = sorted(items, key=_FIRE)  # usually sorted already: one pass
        run = _Run([record for record, _ in ordered], [fire for _, fire in ordered])
        with self._cond:
            head = self._heap[0][0] if self._heap else NEVER
            heapq.heappush(self._heap, (run.fires[0], next(self._seq), run))
            self._size += len(run.records)
            if run.fires[0] < head:
                self._cond.notify()

    def take(self, limit: int) -> Runs:
        """Records due now, at most `limit` (the forwarder comes straight back for more
        while any are due: a burst starts going out at once), as runs by partition."""
        if self._shut():
            return []
        now = min(self._clock(), self._limit())
        records: list[SlotRecord] = []
        with self._cond:
            heap = self._heap
            while heap and heap[0][0] <= now and len(records) < limit:
                _, seq, run = heap[0]
                start, fires = run.start, run.fires
                stop = min(len(fires), start + limit - len(records))
                end = stop if fires[stop - 1] <= now else bisect_right(fires, now, start, stop)
                records.extend(run.records[start:end])
                run.start = end
                if end < len(fires):
                    run.compact()
                    heapq.heapreplace(heap, (run.fires[run.start], seq, run))
                else:
                    heapq.heappop(heap)
            self._size -= len(records)
        runs: dict[TP, list[SlotRecord]] = {}
        for record in self._keep(records):
            runs.setdefault((self.topic, record.partition()), []).append(record)
        return list(runs.items())

    def put_back(
        self,
        tp: TP,
        records: list[SlotRecord],
        not_before_ms: int = 0,
        incarnation: int | None = None,
    ) -> None:
        """Records taken go again: at once, or not before `not_before_ms`. Placement is
        static, so there is no other assignment they could be stale for."""
        self.schedule_many([(record, not_before_ms / 1000) for record in records])

    def incarnation(self, tp: TP) -> int | None:
        return None

    def drop(self, tps: set[TP]) -> None:
        partitions = {partition for topic, partition in tps if topic == self.topic}
        with self._cond:
            kept: list[tuple[float, int, _Run]] = []
            size = 0
            for _, seq, run in self._heap:
                pairs = [
                    (record, fire)
                    for record, fire in zip(
                        run.records[run.start :], run.fires[run.start :], strict=True
                    )
                    if record.partition() not in partitions
                ]
                if pairs:
                    left = _Run([r for r, _ in pairs], [f for _, f in pairs])
                    kept.append((left.fires[0], seq, left))
                    size += len(pairs)
            heapq.heapify(kept)
            self._heap, self._size = kept, size

    def wait(self, deadline: float) -> None:
        """Sleep until the earliest record is due, `deadline` (clock seconds) or `wake`."""
        self._alarm.sleep(deadline, self._head_s)

    def _head_s(self) -> float:
        """NEVER while the head waits for a gate: whoever opens it wakes the taker."""
        if not self._heap or self._shut():
            return NEVER
        head = self._heap[0][0]
        return head if head <= self._limit() else NEVER

    def wake(self) -> None:
        self._alarm.wake()

    def next_due_ms(self) -> int | None:
        """None while a gate holds the head: nothing can be taken, the forwarder is idle."""
        with self._cond:
            head = self._head_s()
        return None if head == NEVER else math.ceil(head * 1000)

    def earliest_held_ms(self) -> int | None:
        with self._cond:
            return math.ceil(self._heap[0][0] * 1000) if self._heap else None

    def settle(self) -> None:
        """Nothing to track: the wheel's gauges come from the census of its disk."""

    def retire(self, runs: Runs) -> None:
        """Nothing kept beside a record: its due time is in it."""

    def due_of(self, tp: TP, record: SlotRecord) -> int:
        return record.due_ms

    def __len__(self) -> int:
        return self._size
