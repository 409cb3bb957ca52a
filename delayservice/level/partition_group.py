"""A level's buffer: one FIFO per partition, and a heap of the partitions' heads.

Due = append time + the level's delay is monotonic in offset order within a level
partition (LogAppendTime), so each partition is already a queue in due order and only
its head can be the next due record. The buffer keeps one deque per partition and a
heap with one entry per non-empty partition (its head's due time), as Kafka Streams'
`PartitionGroup` keeps one `RecordQueue` per partition.

The consumer thread hands over whole runs of one partition's records (`add`) and does
nothing per record: the runs wait in a hand-over queue, counted against their
partition at once so that flow control sees them. The forwarder thread admits them
when it takes (`take`), reading each record's envelope once (`forward.held_record`),
and alone touches the partitions' queues and the heap. It is woken when a handed-over
run may be due before what it waits for, or when the hand-over queue fills.

Records without a broker-written timestamp (a topic switched to CreateTime) are due a
level after they were read, kept beside the queue in `overrides` until they are
committed (a record sent again says the same due time); reading times only
grow, so the order holds for them too. A broker whose clock steps back breaks the
order: a record can then be due before the one ahead of it. It waits behind it (late,
never early), and the shortcut that takes a whole backlog at once trusts the latest due
time ever queued on the partition, not the tail's.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message

from delayservice.forward import speedups
from delayservice.forward.buffer import NEVER, Alarm, Runs
from delayservice.forward.held_record import DUE, HeldView, entry_bytes

Clock = Callable[[], float]
RECORD_KEY_ALLOWANCE: Final = 64
"""Bytes counted per record beside its value (`len(message)`): key and headers, which
the client does not measure without copying them out."""
HANDOVER_MAX: Final = 2_000
"""Records handed over and not yet admitted before the consumer thread waits for the
forwarder (and wakes it): flow control's counts never lag the queues by more."""


def record_bytes(record: Message) -> int:
    """What a held record counts against the memory budget, besides the fixed overhead."""
    return len(record) + RECORD_KEY_ALLOWANCE


class PartitionGroup:
    def __init__(
        self,
        delay_ms: int,
        clock: Clock = time.time,
        previous_delay_ms: int = 0,
        on_not_append_time: Callable[[int], None] | None = None,
    ) -> None:
        """`previous_delay_ms`: the next shorter level's delay (envelopes asking for no
        more than that belong there). `on_not_append_time(n)`: n records admitted
        without a broker-written timestamp."""
        self.delay_ms = delay_ms
        self.previous_delay_ms = previous_delay_ms
        self._clock = clock
        self._on_not_append = on_not_append_time
        lock = threading.Lock()
        self._cond = threading.Condition(lock)
        """Wakes the forwarder: an earlier head, a full hand-over queue, a stop."""
        self._drained = threading.Condition(lock)
        """Wakes the consumer thread: the forwarder admitted or took records."""
        self.queues: dict[int, deque[Any]] = {}
        self.overrides: dict[int, dict[int, int]] = {}
        """partition -> offset -> due ms, for records whose timestamp is not the broker's."""
        self.counts: dict[int, int] = {}
        """partition -> records held, handed over and not yet admitted included."""
        self.bytes: dict[int, int] = {}
        self.not_before: dict[int, int] = {}
        """partition -> epoch ms before which it gives nothing (a forward being retried)."""
        self.latest_due: dict[int, int] = {}
        """partition -> the latest due ms of any record queued since it was last empty."""
        self._heap: list[tuple[int, int]] = []  # (due ms, partition), one per non-empty queue
        self._in_heap: set[int] = set()
        self.incarnations: dict[int, int] = {}
        """partition -> which assignment its queue belongs to: a new number each time the
        queue is made, so records taken under an earlier assignment never return to it."""
        self._incarnation = itertools.count(1)
        self._handed: deque[tuple[int, int, list[Message], int]] = deque()
        """(partition, incarnation, records, read ms) handed over, not yet admitted."""
        self._handed_heads: dict[int, Message] = {}
        """partition -> its first record handed over and not yet admitted."""
        self._handed_due = NEVER
        """Epoch s before which no handed-over record is due (a lower bound)."""
        self._in_hand_ms = NEVER
        """Earliest due (epoch ms) of the records last taken, until the forwarder has
        sent them or put them back (`settle`)."""
        self.handed_records = 0
        self.total_buffered = 0
        self.total_bytes = 0
        self.peak_partition_buffered = 0
        self._alarm = Alarm(self._cond, clock)
        self._hold_run = speedups.fast_path().hold_run

    # -- consumer side -------------------------------------------------------------
    def assign(self, partition: int) -> None:
        with self._cond:
            if partition not in self.queues:
                self.incarnations[partition] = next(self._incarnation)
            self.queues.setdefault(partition, deque())
            self.counts.setdefault(partition, 0)
            self.bytes.setdefault(partition, 0)

    def add(self, partition: int, records: list[Message], size: int, read_ms: int) -> None:
        """Hand over `records` (in offset order) of `partition`, `size` payload bytes in
        all, read at `read_ms`; the forwarder admits them when it next takes."""
        if not records:
            return
        kind, stamp = records[0].timestamp()
        first_due = (stamp if kind == TIMESTAMP_LOG_APPEND_TIME else read_ms) + self.delay_ms
        with self._cond:
            incarnation = self.incarnations.get(partition)
            if incarnation is None:
                return  # not assigned (dropped meanwhile)
            self._handed.append((partition, incarnation, records, read_ms))
            self._handed_heads.setdefault(partition, records[0])
            count = self.counts[partition] + len(records)
            self.counts[partition] = count
            self.bytes[partition] += size
            self.total_buffered += len(records)
            self.total_bytes += size
            self.handed_records += len(records)
            self.peak_partition_buffered = max(self.peak_partition_buffered, count)
            earliest = self._head_s()
            self._handed_due = min(self._handed_due, first_due / 1000)
            if self.handed_records >= HANDOVER_MAX:
                self._alarm.wake_locked()
            elif self._handed_due < earliest:
                self._cond.notify()

    def handover_full(self) -> bool:
        """Whether the forwarder has yet to admit what was handed over (read it, then
        `wait_drained`)."""
        return self.handed_records >= HANDOVER_MAX

    def drop(self, partitions: set[int]) -> None:
        """Forget `partitions` (revoked, lost or rewound) and what they hold."""
        with self._cond:
            for partition in partitions:
                self.queues.pop(partition, None)
                self.incarnations.pop(partition, None)
                self.overrides.pop(partition, None)
                self.not_before.pop(partition, None)
                self.latest_due.pop(partition, None)
                self._handed_heads.pop(partition, None)
                self.total_buffered -= self.counts.pop(partition, 0)
                self.total_bytes -= self.bytes.pop(partition, 0)
            if any(entry[0] in partitions for entry in self._handed):
                kept = [entry for entry in self._handed if entry[0] not in partitions]
                self.handed_records = sum(len(entry[2]) for entry in kept)
                self._handed = deque(kept)
            if self._in_heap & partitions:
                self._in_heap -= partitions
                self._heap = [entry for entry in self._heap if entry[1] not in partitions]
                heapq.heapify(self._heap)
            self._drained.notify_all()

    def head_due(self, partition: int) -> bool:
        """Whether `partition`'s first record is due (its queue is a backlog)."""
        queue = self.queues.get(partition)
        try:
            head = queue[0] if queue else self._handed_heads.get(partition)
            if head is None:
                return False
            return self.due_of(partition, head) <= self._clock() * 1000
        except (IndexError, TypeError):  # taken meanwhile
            return False

    def wait_drained(self, below: int, timeout: float) -> None:
        """Wait up to `timeout` for the forwarder to take or admit records."""
        with self._cond:
            if self.handed_records >= HANDOVER_MAX or any(
                count >= below for count in self.counts.values()
            ):
                self._drained.wait(timeout)

    # -- forwarder side ------------------------------------------------------------
    def due_of(self, partition: int, record: Any) -> int:
        """When `record` (of `partition`) is due at this level: the same each time it is
        asked, a record sent again included (`retire` forgets what was kept for it)."""
        if type(record) is tuple:
            return int(record[DUE])
        if type(record) is HeldView:
            return record.due_ms
        kind, stamp = record.timestamp()
        if kind == TIMESTAMP_LOG_APPEND_TIME:
            return int(stamp) + self.delay_ms
        return self.overrides.get(partition, {}).get(record.offset() or 0, 0)

    def retire(self, runs: Runs) -> None:
        """These records are committed and never go again: the due times kept for those
        without a broker-written timestamp go with them."""
        if not self.overrides:
            return
        with self._cond:
            for partition, records in runs:
                over = self.overrides.get(partition)
                if over:
                    for record in records:
                        if type(record) is not tuple and type(record) is not HeldView:
                            over.pop(record.offset() or 0, None)

    def wait(self, deadline: float) -> None:
        """Sleep until the earliest head is due, `deadline` (clock seconds) or `wake`."""
        self._alarm.sleep(deadline, self._head_s)

    def _head_s(self) -> float:
        head = self._heap[0][0] / 1000 if self._heap else NEVER
        return min(head, self._handed_due)

    def wake(self) -> None:
        self._alarm.wake()

    def next_due_ms(self) -> int | None:
        """When the forwarder next has something to take (a retry's hold included)."""
        with self._cond:
            head = self._head_s()
        return None if head == NEVER else int(head * 1000)

    def earliest_held_ms(self) -> int | None:
        """Due time of the earliest record held: what the next-due and overdue gauges
        say. Unlike `next_due_ms`, a partition held back for a retry counts at its head's
        due time, and records taken and still being sent count, so a forward that
        cannot go out (an unreachable broker's metadata takes seconds to fail) shows as
        overdue all along instead of as nothing held."""
        with self._cond:
            earliest = min(self._handed_due * 1000, self._in_hand_ms)
            if self.not_before:  # a live retry hold: its head counts at its own due time
                for key, partition in self._heap:
                    queue = self.queues.get(partition)
                    if partition in self.not_before and queue:
                        earliest = min(earliest, self.due_of(partition, queue[0]))
                    else:
                        earliest = min(earliest, key)
            elif self._heap:
                earliest = min(earliest, self._heap[0][0])
        return None if earliest == NEVER else int(earliest)

    def settle(self) -> None:
        """What was last taken has been sent or put back."""
        self._in_hand_ms = NEVER

    def admit(self) -> None:
        """Move what the consumer thread handed over into the partitions' queues, each
        record's envelope read once (`fast_path.hold_run`). The forwarder thread's alone."""
        with self._cond:
            if not self._handed:
                return
            handed, self._handed = self._handed, deque()
            self.handed_records = 0
            self._handed_due = NEVER
            self._handed_heads.clear()
        delay, previous = self.delay_ms, self.previous_delay_ms
        admitted = [
            (partition, incarnation, self._hold_run(records, delay, previous, read_ms))
            for partition, incarnation, records, read_ms in handed
        ]
        not_append = 0
        with self._cond:
            for partition, incarnation, (entries, run_latest, unstamped) in admitted:
                queue = self.queues.get(partition)
                if queue is None or self.incarnations.get(partition) != incarnation:
                    continue  # dropped meanwhile (its counts went with it)
                if unstamped:
                    not_append += len(unstamped)
                    self.overrides.setdefault(partition, {}).update(unstamped)
                latest = run_latest
                if queue and self.latest_due.get(partition, 0) > latest:
                    latest = self.latest_due[partition]
                self.latest_due[partition] = latest
                was_empty = not queue
                queue.extend(entries)
                if was_empty and partition not in self._in_heap and queue:
                    due = max(self.due_of(partition, queue[0]), self.not_before.get(partition, 0))
                    heapq.heappush(self._heap, (due, partition))
                    self._in_heap.add(partition)
            self._drained.notify_all()
        if not_append and self._on_not_append is not None:
            self._on_not_append(not_append)

    def take(self, limit: int) -> list[tuple[int, list[Any]]]:
        """Records due now, at most about `limit`, as (partition, entries in offset order)
        runs, earliest head first. Never a record before its due time."""
        self.admit()
        now_ms = int(self._clock() * 1000)
        out: list[tuple[int, list[Any]]] = []
        taken = 0
        due_of = self.due_of
        with self._cond:
            heap = self._heap
            while heap and heap[0][0] <= now_ms and taken < limit:
                _, partition = heapq.heappop(heap)
                if self.not_before:
                    self.not_before.pop(partition, None)  # its retry hold, if any, is over
                queue = self.queues.get(partition)
                if queue is None or not queue:
                    self._in_heap.discard(partition)
                    continue
                run: list[Any] = []
                if self.latest_due.get(partition, 0) <= now_ms:  # a backlog: all of it is due
                    pop = queue.popleft
                    run = [pop() for _ in range(min(len(queue), limit - taken))]
                else:
                    while queue and taken + len(run) < limit:
                        if due_of(partition, queue[0]) > now_ms:
                            break
                        run.append(queue.popleft())
                taken += len(run)
                if run:
                    self._drained.notify_all()
                    out.append((partition, run))
                    self._taken(partition, len(run), not queue)
                if queue:
                    next_due = max(due_of(partition, queue[0]), self.not_before.get(partition, 0))
                    heapq.heappush(heap, (next_due, partition))
                else:
                    self._in_heap.discard(partition)
            if out:
                self._in_hand_ms = min(due_of(partition, run[0]) for partition, run in out)
        return out

    def _taken(self, partition: int, count: int, emptied: bool) -> None:
        """Count `count` records out of `partition`. Their bytes are the partition's
        average (exact once it is empty, so nothing drifts): a record's size is not
        kept beside it."""
        held = self.counts[partition]
        size = self.bytes[partition]
        pending = sum(len(e[2]) for e in self._handed if e[0] == partition) if emptied else 0
        out = size if emptied and not pending else size * count // max(held, 1)
        self.counts[partition] = held - count
        self.bytes[partition] = size - out
        self.total_buffered -= count
        self.total_bytes -= out

    def incarnation(self, partition: int) -> int | None:
        """Which assignment the partition's queue belongs to (None: not assigned)."""
        return self.incarnations.get(partition)

    def put_back(
        self,
        partition: int,
        records: list[Any],
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
            size = sum(entry_bytes(record, RECORD_KEY_ALLOWANCE) for record in records)
            self.counts[partition] += len(records)
            self.bytes[partition] += size
            self.total_buffered += len(records)
            self.total_bytes += size
            if not_before_ms:
                self.not_before[partition] = not_before_ms
            if queue:
                due = max(self.due_of(partition, queue[0]), self.not_before.get(partition, 0))
                self._heap = [entry for entry in self._heap if entry[1] != partition]
                self._heap.append((due, partition))
                heapq.heapify(self._heap)
                self._in_heap.add(partition)
            self._cond.notify()

    def __len__(self) -> int:
        return self.total_buffered
