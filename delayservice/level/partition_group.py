"""A level's buffer: one FIFO per partition, and a heap of the partitions' heads.

Due = append time + the level's delay is monotonic in offset order within a level
partition (LogAppendTime), so each partition is already a queue in due order and only
its head can be the next due record. The buffer therefore keeps the records as the
client returned them, one deque per partition, and a heap with one entry per
non-empty partition (its head's due time), as Kafka Streams' `PartitionGroup` keeps
one `RecordQueue` per partition. Admitting a record is an append; nothing per record
is wrapped or pushed on a heap. Records without a broker-written timestamp (a topic
switched to CreateTime) are due a level after they were read, kept beside the queue
in `overrides`; reading times only grow, so the order holds for them too. A broker
whose clock steps back breaks the order: a record can then be due before the one ahead
of it. It waits behind it (late, never early), and the shortcut that takes a whole
backlog at once trusts the latest due time ever queued on the partition, not the tail's.

The consumer thread appends; the forwarder thread takes. One condition orders the
two and wakes the forwarder when a new head is due earlier than what it waits for.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Final

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message

from delayservice.forward.buffer import NEVER, Alarm

Clock = Callable[[], float]
RECORD_KEY_ALLOWANCE: Final = 64
"""Bytes counted per record beside its value (`len(message)`): key and headers, which
the client does not measure without copying them out."""


def record_bytes(record: Message) -> int:
    """What a held record counts against the memory budget, besides the fixed overhead."""
    return len(record) + RECORD_KEY_ALLOWANCE


class PartitionGroup:
    def __init__(self, delay_ms: int, clock: Clock = time.time) -> None:
        self.delay_ms = delay_ms
        self._clock = clock
        lock = threading.Lock()
        self._cond = threading.Condition(lock)
        """Wakes the forwarder: an earlier head, a stop."""
        self._drained = threading.Condition(lock)
        """Wakes the consumer thread: the forwarder took records."""
        self.queues: dict[int, deque[Message]] = {}
        self.overrides: dict[int, dict[int, int]] = {}
        """partition -> offset -> due ms, for records whose timestamp is not the broker's."""
        self.counts: dict[int, int] = {}
        self.bytes: dict[int, int] = {}
        self.not_before: dict[int, int] = {}
        self.latest_due: dict[int, int] = {}
        """partition -> the latest due ms of any record queued since it was last empty."""
        """partition -> epoch ms before which it gives nothing (a forward being retried)."""
        self._heap: list[tuple[int, int]] = []  # (due ms, partition), one per non-empty queue
        self._in_heap: set[int] = set()
        self.incarnations: dict[int, int] = {}
        """partition -> which assignment its queue belongs to: a new number each time the
        queue is made, so records taken under an earlier assignment never return to it."""
        self._incarnation = itertools.count(1)
        self.total_buffered = 0
        self.total_bytes = 0
        self.peak_partition_buffered = 0
        self._alarm = Alarm(self._cond, clock)

    # -- consumer side -------------------------------------------------------------
    def assign(self, partition: int) -> None:
        with self._cond:
            if partition not in self.queues:
                self.incarnations[partition] = next(self._incarnation)
            self.queues.setdefault(partition, deque())
            self.counts.setdefault(partition, 0)
            self.bytes.setdefault(partition, 0)

    def add(self, partition: int, records: list[Message], size: int, read_ms: int) -> int:
        """Append `records` (in offset order) of `partition`, `size` payload bytes in all;
        returns how many carried no broker-written timestamp."""
        queue = self.queues.get(partition)
        if queue is None or not records:
            return 0
        delay = self.delay_ms
        stamps = [record.timestamp() for record in records]
        late = [
            (record.offset() or 0, read_ms + delay)
            for record, (kind, _) in zip(records, stamps, strict=True)
            if kind != TIMESTAMP_LOG_APPEND_TIME
        ]
        if late:  # their own timestamps mean nothing: due a level after reading
            appended = [stamp for kind, stamp in stamps if kind == TIMESTAMP_LOG_APPEND_TIME]
            latest = max([read_ms, *appended]) + delay
        else:
            latest = max(stamp for _, stamp in stamps) + delay
        with self._cond:
            if self.queues.get(partition) is not queue:
                return 0  # dropped meanwhile
            if late:
                self.overrides.setdefault(partition, {}).update(late)
            if queue and self.latest_due.get(partition, 0) > latest:
                latest = self.latest_due[partition]
            self.latest_due[partition] = latest
            was_empty = not queue
            queue.extend(records)
            count = self.counts[partition] + len(records)
            self.counts[partition] = count
            self.bytes[partition] += size
            self.total_buffered += len(records)
            self.total_bytes += size
            self.peak_partition_buffered = max(self.peak_partition_buffered, count)
            if was_empty and partition not in self._in_heap:
                due = max(self._due(partition, queue[0]), self.not_before.get(partition, 0))
                earliest = self._heap[0][0] if self._heap else None
                heapq.heappush(self._heap, (due, partition))
                self._in_heap.add(partition)
                if earliest is None or due < earliest:
                    self._cond.notify()
        return len(late)

    def drop(self, partitions: set[int]) -> None:
        """Forget `partitions` (revoked, lost or rewound) and what they hold."""
        with self._cond:
            for partition in partitions:
                self.queues.pop(partition, None)
                self.incarnations.pop(partition, None)
                self.overrides.pop(partition, None)
                self.not_before.pop(partition, None)
                self.latest_due.pop(partition, None)
                self.total_buffered -= self.counts.pop(partition, 0)
                self.total_bytes -= self.bytes.pop(partition, 0)
            if self._in_heap & partitions:
                self._in_heap -= partitions
                self._heap = [entry for entry in self._heap if entry[1] not in partitions]
                heapq.heapify(self._heap)

    # -- forwarder side ------------------------------------------------------------
    def _due(self, partition: int, record: Message) -> int:
        kind, stamp = record.timestamp()
        if kind == TIMESTAMP_LOG_APPEND_TIME:
            return int(stamp) + self.delay_ms
        return self.overrides.get(partition, {}).get(record.offset() or 0, 0)

    def due_of(self, partition: int, record: Message) -> int:
        """When `record` (taken from `partition`) was due at this level."""
        kind, stamp = record.timestamp()
        if kind == TIMESTAMP_LOG_APPEND_TIME:
            return int(stamp) + self.delay_ms
        with self._cond:
            over = self.overrides.get(partition)
            return over.pop(record.offset() or 0, 0) if over else 0

    def head_due(self, partition: int) -> bool:
        """Whether `partition`'s first record is due (its queue is a backlog)."""
        queue = self.queues.get(partition)
        if not queue:
            return False
        try:
            return self._due(partition, queue[0]) <= self._clock() * 1000
        except IndexError:  # taken meanwhile
            return False

    def wait_drained(self, below: int, timeout: float) -> None:
        """Wait up to `timeout` for the forwarder to take records (any partition)."""
        with self._cond:
            if any(count >= below for count in self.counts.values()):
                self._drained.wait(timeout)

    def wait(self, deadline: float) -> None:
        """Sleep until the earliest head is due, `deadline` (clock seconds) or `wake`."""
        self._alarm.sleep(deadline, self._head_s)

    def _head_s(self) -> float:
        return self._heap[0][0] / 1000 if self._heap else NEVER

    def wake(self) -> None:
        self._alarm.wake()

    def next_due_ms(self) -> int | None:
        with self._cond:
            return self._heap[0][0] if self._heap else None

    def take(self, limit: int) -> list[tuple[int, list[Message]]]:
        """Records due now, at most about `limit`, as (partition, records in offset order)
        runs, earliest head first. Never a record before its due time."""
        now_ms = int(self._clock() * 1000)
        out: list[tuple[int, list[Message]]] = []
        taken = 0
        delay = self.delay_ms
        with self._cond:
            heap = self._heap
            while heap and heap[0][0] <= now_ms and taken < limit:
                _, partition = heapq.heappop(heap)
                queue = self.queues.get(partition)
                if queue is None or not queue:
                    self._in_heap.discard(partition)
                    continue
                overrides = self.overrides.get(partition)
                run: list[Message] = []
                if self.latest_due.get(partition, 0) <= now_ms:  # a backlog: all of it is due
                    pop = queue.popleft
                    run = [pop() for _ in range(min(len(queue), limit - taken))]
                else:
                    while queue and taken + len(run) < limit:
                        kind, stamp = queue[0].timestamp()
                        if kind == TIMESTAMP_LOG_APPEND_TIME:
                            due = stamp + delay
                        else:
                            due = overrides.get(queue[0].offset() or 0, 0) if overrides else 0
                        if due > now_ms:
                            break
                        run.append(queue.popleft())
                taken += len(run)
                size = sum(map(len, run)) + RECORD_KEY_ALLOWANCE * len(run)
                if run:
                    self._drained.notify_all()
                    out.append((partition, run))
                    self.counts[partition] -= len(run)
                    self.bytes[partition] = max(0, self.bytes[partition] - size)
                    self.total_buffered -= len(run)
                    self.total_bytes = max(0, self.total_bytes - size)
                if queue:
                    next_due = max(
                        self._due(partition, queue[0]), self.not_before.get(partition, 0)
                    )
                    heapq.heappush(heap, (next_due, partition))
                else:
                    self._in_heap.discard(partition)
        return out

    def incarnation(self, partition: int) -> int | None:
        """Which assignment the partition's queue belongs to (None: not assigned)."""
        return self.incarnations.get(partition)

    def put_back(
        self,
        partition: int,
        records: list[Message],
        not_before_ms: int = 0,
        incarnation: int | None = None,
    ) -> None:
        """Return taken `records` to the front of their queue (a transaction was aborted),
        optionally holding the partition until `not_before_ms` (a retry's backoff).
        Records taken under another assignment (`incarnation`) are refused: the partition
        was revoked and came back, and is read again from its last commit."""
        with self._cond:
            queue = self.queues.get(partition)
            if queue is None:
                return  # revoked meanwhile: its new owner re-reads from the last commit
            if incarnation is not None and self.incarnations.get(partition) != incarnation:
                return  # revoked and assigned again since they were taken: stale
            queue.extendleft(reversed(records))
            size = sum(map(record_bytes, records))
            self.counts[partition] += len(records)
            self.bytes[partition] += size
            self.total_buffered += len(records)
            self.total_bytes += size
            if not_before_ms:
                self.not_before[partition] = not_before_ms
            if queue:
                due = max(self._due(partition, queue[0]), self.not_before.get(partition, 0))
                self._heap = [entry for entry in self._heap if entry[1] != partition]
                self._heap.append((due, partition))
                heapq.heapify(self._heap)
                self._in_heap.add(partition)
            self._cond.notify()

    def release(self, partition: int) -> None:
        """End a partition's retry hold."""
        with self._cond:
            if self.not_before.pop(partition, None) is None:
                return
            queue = self.queues.get(partition)
            if queue:
                self._heap = [entry for entry in self._heap if entry[1] != partition]
                self._heap.append((self._due(partition, queue[0]), partition))
                heapq.heapify(self._heap)
                self._in_heap.add(partition)
                self._cond.notify()

    def __len__(self) -> int:
        return self.total_buffered
