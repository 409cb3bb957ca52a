"""A worker's buffer: one FIFO per level partition, and a heap of the partitions' heads.

Due = append time + the level's delay is monotonic in offset order within a level
partition (LogAppendTime), so each partition is already a queue in due order and only
its head can be the next due record. The buffer keeps one deque per (topic, partition)
of every level its worker serves and one heap with an entry per non-empty partition
(its head's due time), as Kafka Streams' `PartitionGroup` keeps one `RecordQueue` per
partition: the earliest head goes first, whatever its level.

The consumer thread hands over whole runs of one partition's records (`add`) and does
nothing per record: the runs wait in a hand-over queue, counted against their
partition and level at once so that flow control sees them. The forwarder thread
admits them when it takes (`take`), reading each record's envelope once
(`forward.held_record`), and alone touches the partitions' queues and the heap. It is
woken when a handed-over run may be due before what it waits for, or when the
hand-over queue fills.

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
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message

from delayservice.forward import speedups
from delayservice.forward.buffer import NEVER, TP, Alarm, Runs
from delayservice.forward.held_record import DUE, HeldView, entry_bytes

if TYPE_CHECKING:
    from delayservice.level.markers.actions import WorkerMarkers

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
        delays: Iterable[tuple[str, int, int]],
        clock: Clock = time.time,
        on_not_append_time: Callable[[str, int], None] | None = None,
        markers: WorkerMarkers | None = None,
    ) -> None:
        """`delays`: (topic, its level's delay, the next shorter level's delay) of each
        level served; envelopes asking for no more than the shorter one belong there.
        `on_not_append_time(topic, n)`: n records admitted without a broker-written
        timestamp. `markers`: its worker's cancels and reschedules; nothing is taken
        that is due after the markers read (`MarkerGate`)."""
        self._delays = {topic: (delay, previous) for topic, delay, previous in delays}
        self._clock = clock
        self._on_not_append = on_not_append_time
        lock = threading.Lock()
        self._cond = threading.Condition(lock)
        """Wakes the forwarder: an earlier head, a full hand-over queue, a stop."""
        self._drained = threading.Condition(lock)
        """Wakes the consumer thread: the forwarder admitted or took records."""
        self.queues: dict[TP, deque[Any]] = {}
        self.overrides: dict[TP, dict[int, int]] = {}
        """partition -> offset -> due ms, for records whose timestamp is not the broker's."""
        self.counts: dict[TP, int] = {}
        """partition -> records held, handed over and not yet admitted included."""
        self.bytes: dict[TP, int] = {}
        self.held: dict[str, int] = dict.fromkeys(self._delays, 0)
        """level topic -> records held (flow control's per-level count, the gauges)."""
        self.held_bytes: dict[str, int] = dict.fromkeys(self._delays, 0)
        self.not_before: dict[TP, int] = {}
        """partition -> epoch ms before which it gives nothing (a forward being retried)."""
        self.latest_due: dict[TP, int] = {}
        """partition -> the latest due ms of any record queued since it was last empty."""
        self._heap: list[tuple[int, TP]] = []  # (due ms, partition), one per non-empty queue
        self._in_heap: set[TP] = set()
        self.incarnations: dict[TP, int] = {}
        """partition -> which assignment its queue belongs to: a new number each time the
        queue is made, so records taken under an earlier assignment never return to it."""
        self._incarnation = itertools.count(1)
        self._handed: deque[tuple[TP, int, list[Message], int]] = deque()
        """(partition, incarnation, records, read ms) handed over, not yet admitted."""
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
        self._sleeps_until = NEVER
        """What the forwarder's sleep last computed (`_ready_s`): a run handed over due
        before it must wake the forwarder. Not the earliest head: while that head
        waits on its markers the forwarder sleeps past it."""
        self._hold_run = speedups.fast_path().hold_run
        self._markers = markers
        if markers is not None:
            markers.queue_of = self.queues.get
            markers.due_of = self.due_of
            markers.wake = self.wake

    @property
    def topics(self) -> list[str]:
        """The level topics this group holds records of."""
        return list(self._delays)

    # -- consumer side -------------------------------------------------------------
    def assign(self, tp: TP) -> None:
        with self._cond:
            if tp not in self.queues:
                self.incarnations[tp] = next(self._incarnation)
            self.queues.setdefault(tp, deque())
            self.counts.setdefault(tp, 0)
            self.bytes.setdefault(tp, 0)
        if self._markers is not None:
            self._markers.assigned(tp)

    def add(self, tp: TP, records: list[Message], size: int, read_ms: int) -> None:
        """Hand over `records` (in offset order) of `tp`, `size` payload bytes in all,
        read at `read_ms`; the forwarder admits them when it next takes."""
        if not records:
            return
        kind, stamp = records[0].timestamp()
        delay = self._delays[tp[0]][0]
        appended = stamp if kind == TIMESTAMP_LOG_APPEND_TIME else read_ms
        first_due = appended + delay
        if self._markers is not None:
            self._markers.need(tp, appended)  # before the forwarder can take them
        with self._cond:
            incarnation = self.incarnations.get(tp)
            if incarnation is None:
                return  # not assigned (dropped meanwhile)
            self._handed.append((tp, incarnation, records, read_ms))
            count = self.counts[tp] + len(records)
            self.counts[tp] = count
            self.bytes[tp] += size
            self.held[tp[0]] += len(records)
            self.held_bytes[tp[0]] += size
            self.total_buffered += len(records)
            self.total_bytes += size
            self.handed_records += len(records)
            self.peak_partition_buffered = max(self.peak_partition_buffered, count)
            self._handed_due = min(self._handed_due, first_due / 1000)
            if self.handed_records >= HANDOVER_MAX:
                self._alarm.wake_locked()
            elif self._handed_due < self._sleeps_until:
                self._cond.notify()

    def handover_full(self) -> bool:
        """Whether the forwarder has yet to admit what was handed over (read it, then
        `wait_drained`)."""
        return self.handed_records >= HANDOVER_MAX

    def drop(self, tps: set[TP]) -> None:
        """Forget `tps` (revoked, lost or rewound) and what they hold."""
        with self._cond:
            for tp in tps:
                self.queues.pop(tp, None)
                self.incarnations.pop(tp, None)
                self.overrides.pop(tp, None)
                self.not_before.pop(tp, None)
                self.latest_due.pop(tp, None)
                count, size = self.counts.pop(tp, 0), self.bytes.pop(tp, 0)
                self._uncount(tp[0], count, size)
            if any(entry[0] in tps for entry in self._handed):
                kept = [entry for entry in self._handed if entry[0] not in tps]
                self.handed_records = sum(len(entry[2]) for entry in kept)
                self._handed = deque(kept)
            if self._in_heap & tps:
                self._in_heap -= tps
                self._heap = [entry for entry in self._heap if entry[1] not in tps]
                heapq.heapify(self._heap)
            self._drained.notify_all()
        if self._markers is not None:
            self._markers.released(tps)

    def _uncount(self, topic: str, count: int, size: int) -> None:
        if topic in self.held:
            self.held[topic] -= count
            self.held_bytes[topic] -= size
        self.total_buffered -= count
        self.total_bytes -= size

    def wait_drained(self, timeout: float) -> None:
        """Wait up to `timeout` for the forwarder to admit what was handed over."""
        with self._cond:
            if self.handed_records >= HANDOVER_MAX:
                self._drained.wait(timeout)

    # -- forwarder side ------------------------------------------------------------
    def due_of(self, tp: TP, record: Any) -> int:
        """When `record` (of `tp`) is due at its level: the same each time it is asked,
        a record sent again included (`retire` forgets what was kept for it)."""
        if type(record) is tuple:
            return int(record[DUE])
        if type(record) is HeldView:
            return record.due_ms
        kind, stamp = record.timestamp()
        if kind == TIMESTAMP_LOG_APPEND_TIME:
            return int(stamp) + self._delays[tp[0]][0]
        return self.overrides.get(tp, {}).get(record.offset() or 0, 0)

    def retire(self, runs: Runs) -> None:
        """These records are committed and never go again: the due times kept for those
        without a broker-written timestamp go with them, and (with markers) no marker
        older than the lead before them is needed for their partition any more."""
        if self._markers is not None:
            for tp, records in runs:
                if records and tp[0] in self._delays:
                    self._markers.progress(tp, self._appended(tp, records[-1]))
        if not self.overrides:
            return
        with self._cond:
            for tp, records in runs:
                over = self.overrides.get(tp)
                if over:
                    for record in records:
                        if type(record) is not tuple and type(record) is not HeldView:
                            over.pop(record.offset() or 0, None)

    def _appended(self, tp: TP, record: Any) -> int:
        """A queued record's append time: a held one's due time less its level's delay."""
        if type(record) is tuple:
            return int(record[DUE]) - self._delays[tp[0]][0]
        if type(record) is HeldView:
            return record.due_ms - self._delays[tp[0]][0]
        return int(record.timestamp()[1])

    def wait(self, deadline: float) -> None:
        """Sleep until the earliest head may be taken, `deadline` (clock seconds) or
        `wake`."""
        self._alarm.sleep(deadline, self._ready_s)

    def _ready_s(self) -> float:
        """When the earliest head may be taken (read under the group's lock): its due
        time, once the markers of its partition are read through it; a head due whose
        markers are not waits for the reader to wake it, and the others go on (a flood
        of markers on one markers partition holds back only the records whose markers
        go there)."""
        self._sleeps_until = ready = self._ready_head_s()
        return ready

    def _ready_head_s(self) -> float:
        head = self._head_s()
        markers = self._markers
        if markers is None or head == NEVER:
            return head
        now = self._clock()
        if head > now or math.ceil(head * 1000) <= markers.through_ms():
            return head  # not due yet, or every partition's markers are read past it
        ready = self._handed_due  # admitted, a run of another partition may go at once
        for due_ms, tp in self._heap:  # under the group's lock (`Alarm.sleep`)
            due = due_ms / 1000
            if due > now or due_ms <= markers.through_ms(tp[1]):
                ready = min(ready, due)
            else:
                markers.want(id(self), due_ms, self.wake, tp[1])
        return ready

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

    def earliest_held_ms(self, topic: str | None = None) -> int | None:
        """Due time of the earliest record held (of `topic`'s partitions, or of all):
        what the next-due and overdue gauges say. Unlike `next_due_ms`, a partition
        held back for a retry counts at its head's due time, and records taken and
        still being sent count, so a forward that cannot go out (an unreachable
        broker's metadata takes seconds to fail) shows as overdue all along instead of
        as nothing held. Records handed over and not yet admitted count at a lower
        bound (all of them, whatever their level, for one topic)."""
        with self._cond:
            earliest = min(self._handed_due * 1000, self._in_hand_ms)
            if self.not_before or topic is not None:
                for key, tp in self._heap:
                    if topic is not None and tp[0] != topic:
                        continue
                    queue = self.queues.get(tp)
                    if tp in self.not_before and queue:
                        earliest = min(earliest, self.due_of(tp, queue[0]))
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
        delays = self._delays
        admitted = [
            (tp, incarnation, self._hold_run(records, *delays[tp[0]], read_ms))
            for tp, incarnation, records, read_ms in handed
        ]
        not_append: dict[str, int] = {}
        with self._cond:
            for tp, incarnation, (entries, run_latest, unstamped) in admitted:
                queue = self.queues.get(tp)
                if queue is None or self.incarnations.get(tp) != incarnation:
                    continue  # dropped meanwhile (its counts went with it)
                if unstamped:
                    not_append[tp[0]] = not_append.get(tp[0], 0) + len(unstamped)
                    self.overrides.setdefault(tp, {}).update(unstamped)
                latest = run_latest
                if queue and self.latest_due.get(tp, 0) > latest:
                    latest = self.latest_due[tp]
                self.latest_due[tp] = latest
                was_empty = not queue
                queue.extend(entries)
                if was_empty and tp not in self._in_heap and queue:
                    due = max(self.due_of(tp, queue[0]), self.not_before.get(tp, 0))
                    heapq.heappush(self._heap, (due, tp))
                    self._in_heap.add(tp)
            self._drained.notify_all()
        if not_append and self._on_not_append is not None:
            for topic, count in not_append.items():
                self._on_not_append(topic, count)

    def take(self, limit: int) -> Runs:
        """Records due now, at most about `limit`, as (partition, entries in offset order)
        runs, earliest head first. Never a record before its due time."""
        self.admit()
        clock_ms = now_ms = int(self._clock() * 1000)
        markers = self._markers
        gated = markers is not None and markers.through_ms() < clock_ms
        shut: list[tuple[int, TP]] = []
        out: Runs = []
        taken = 0
        due_of = self.due_of
        with self._cond:
            heap = self._heap
            while heap and heap[0][0] <= clock_ms and taken < limit:
                if gated and markers is not None:  # each partition as far as its markers
                    now_ms = min(clock_ms, markers.through_ms(heap[0][1][1]))
                    if heap[0][0] > now_ms:
                        shut.append(heapq.heappop(heap))
                        continue
                _, tp = heapq.heappop(heap)
                if self.not_before:
                    self.not_before.pop(tp, None)  # its retry hold, if any, is over
                queue = self.queues.get(tp)
                if queue is None or not queue:
                    self._in_heap.discard(tp)
                    continue
                run = self._run_of(tp, queue, now_ms, limit - taken)
                taken += len(run)
                if run:
                    self._drained.notify_all()
                    out.append((tp, run))
                    self._taken(tp, len(run), not queue)
                if queue:
                    next_due = max(due_of(tp, queue[0]), self.not_before.get(tp, 0))
                    heapq.heappush(heap, (next_due, tp))
                else:
                    self._in_heap.discard(tp)
            for entry in shut:
                heapq.heappush(heap, entry)
            if out:
                self._in_hand_ms = min(due_of(tp, run[0]) for tp, run in out)
        return out

    def _run_of(self, tp: TP, queue: deque[Any], now_ms: int, room: int) -> list[Any]:
        """Up to `room` records off the front of `tp`'s queue, due by `now_ms`."""
        if self.latest_due.get(tp, 0) <= now_ms:  # a backlog: all of it is due
            pop = queue.popleft
            return [pop() for _ in range(min(len(queue), room))]
        run: list[Any] = []
        due_of = self.due_of
        while queue and len(run) < room:
            if due_of(tp, queue[0]) > now_ms:
                break
            run.append(queue.popleft())
        return run

    def _taken(self, tp: TP, count: int, emptied: bool) -> None:
        """Count `count` records out of `tp`. Their bytes are the partition's average
        (exact once it is empty, so nothing drifts): a record's size is not kept beside
        it."""
        held = self.counts[tp]
        size = self.bytes[tp]
        pending = sum(len(e[2]) for e in self._handed if e[0] == tp) if emptied else 0
        out = size if emptied and not pending else size * count // max(held, 1)
        self.counts[tp] = held - count
        self.bytes[tp] = size - out
        self._uncount(tp[0], count, out)

    def incarnation(self, tp: TP) -> int | None:
        """Which assignment the partition's queue belongs to (None: not assigned)."""
        return self.incarnations.get(tp)

    def put_back(
        self,
        tp: TP,
        records: list[Any],
        not_before_ms: int = 0,
        incarnation: int | None = None,
    ) -> None:
        """Return taken `records` to the front of their queue (a transaction was aborted),
        optionally holding the partition until `not_before_ms` (a retry's backoff).
        Records taken under another assignment (`incarnation`) are refused: the partition
        was revoked and came back, and is read again from its last commit."""
        with self._cond:
            queue = self.queues.get(tp)
            if queue is None:
                return  # revoked meanwhile: its new owner re-reads from the last commit
            if incarnation is not None and self.incarnations.get(tp) != incarnation:
                return  # revoked and assigned again since they were taken: stale
            queue.extendleft(reversed(records))
            size = sum(entry_bytes(record, RECORD_KEY_ALLOWANCE) for record in records)
            self.counts[tp] += len(records)
            self.bytes[tp] += size
            self._uncount(tp[0], -len(records), -size)
            if not_before_ms:
                self.not_before[tp] = not_before_ms
            if queue:
                due = max(self.due_of(tp, queue[0]), self.not_before.get(tp, 0))
                self._heap = [entry for entry in self._heap if entry[1] != tp]
                self._heap.append((due, tp))
                heapq.heapify(self._heap)
                self._in_heap.add(tp)
            self._cond.notify()

    def __len__(self) -> int:
        return self.total_buffered
