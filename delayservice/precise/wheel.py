"""The wheel: one file per 1 s slot near the pointer, coarser span files further out,
the slots about to fire in memory.

Near the pointer the source material's rule holds: a slot file is only appended to or
deleted whole. Further out (see `tiers`) records wait in span files, hours, days or
32 days wide, which are likewise only appended to or deleted whole; a span is split
into finer files (`splitter`) at least one horizon before its first second. So the
files on disk, and what the process keeps per file, are bounded whatever the delays,
and a batch of far-future records costs the intake a few writes, not one per record.

A slot comes into memory when the pointer nears it, through a `SlotIndex` (positions
and due milliseconds first, payloads a batch at a time) while the records held stay
under `max_buffered_bytes`: a burst due in one second drains with bounded memory. Its
file is deleted once every record in it is settled (forwarded, dead-lettered,
cancelled or, for a replica's copy, reported done by the owner).

Threads: the intake thread appends, the loader thread (here) reads slots in, the
splitter thread splits spans, the forwarder takes due records; one lock orders appends
against loads, splits and deletes, so a record is in memory exactly once.
"""

from __future__ import annotations

import functools
import heapq
import logging
import threading
import time
from collections.abc import Iterable
from typing import Final, NamedTuple, Protocol

from delayservice.precise.cancel_log import CancelLog
from delayservice.precise.copy_finder import find_copies
from delayservice.precise.heap_trim import release_free_heap
from delayservice.precise.placement import Placement, Role
from delayservice.precise.recent_ids import RecentIds
from delayservice.precise.reschedule_log import Move, RescheduleLog
from delayservice.precise.slot_buffer import SlotBuffer
from delayservice.precise.slot_file import StoredRecord, encode, encode_settled
from delayservice.precise.slot_index import SlotIndex
from delayservice.precise.slot_ledger import SlotTracker
from delayservice.precise.slot_record import SlotRecord
from delayservice.precise.slot_store import Key, SlotStore
from delayservice.precise.splitter import split
from delayservice.precise.storage_fault import StorageError
from delayservice.precise.tiers import DEFAULT_HORIZON_S, Tiers
from delayservice.timers.base import Clock

log = logging.getLogger(__name__)

LOAD_BYTES_PER_S: Final = 10_000_000
"""A slot file is read this many bytes per second ahead of the look-ahead, so a burst
due in one second (one big slot) is in memory before it is due; decoding runs at about
three times this on a 2-core host."""
MAX_LEAD_S: Final = 60.0
"""At most this far beyond the look-ahead does a slot's size move its load earlier."""
MARKS_EVERY_S: Final = 0.05
"""How often settled marks are written to their slot files, in one write per slot."""
RECENTLY_FORWARDED: Final = 100_000
"""Ids of records lately sent, and of those lately called off, kept (at least the last
half this many, at most this many), so a marker that comes after can be told so."""
EXPIRE_EVERY_S: Final = 60.0
RECORD_OVERHEAD: Final = 900
"""Bytes a held record costs in memory beyond its frame: the record, its envelope, the
key, value and header objects and its heap row (about 610 B by tracemalloc on CPython
3.11), and its share of the client's send buffers while in flight (the rest of the
1.1 KB per held record a 500,000 burst cost in resident memory)."""
LOAD_AT_MOST: Final = 5_000
"""Records read into memory per step of a slot's loading."""
SPLIT_EVERY_S: Final = 1.0
TRIM_EVERY_S: Final = 1.0
TRIM_BELOW: Final = 32 * 1024 * 1024
"""Freed heap is given back only while the wheel holds less than this: while records
are being forwarded, pages given back would only be faulted in again."""
FILL_SLICE_S: Final = 0.1
"""At most this long reading records in at a time, so settled marks keep being written."""
UNBOUNDED: Final = 2**62
READ_AGAIN: Final = "read_again"
"""A reschedule marker read again after a restart: it, or a later marker, moved the
message already."""
FIND_TRIES: Final = 3
"""Searches for a reschedule's copies outside the wheel's lock before one holding it."""


class Coverage(Protocol):
    """What the other holder of a partition has reported settled (replicas only)."""

    @property
    def ready(self) -> bool: ...

    def covers(self, partition: int, offset: int, due_ms: int) -> bool: ...


NOT_READY_RETRY_S: Final = 0.5
"""How soon a copy waiting for the other holder's reports to be read is looked at again."""


class Reschedule(NamedTuple):
    """A reschedule marker as the intake read it."""

    message_id: str
    partition: int
    version: int  # the marker's offset: the offset its copy gets
    due_ms: int
    replica: bool  # this member holds the partition's replica
    fire_ms: int  # due_ms, plus the takeover delay for a replica's copy


def _moved_meanwhile(before: list[tuple[Key, int]], now: list[tuple[Key, int]]) -> bool:
    """Whether records may have reached files a search of `before` did not read: a file
    appeared, or a span went (split into finer files)."""
    old = {key for key, _ in before}
    current = {key for key, _ in now}
    return bool(current - old) or any(key[2] != 1 for key in old - current)


class Outcomes(Protocol):
    """Counters the wheel reports to; the metrics object provides them."""

    def cancelled(self, outcome: str, count: int = 1) -> None: ...

    def cleaned(self) -> None: ...

    def took_over(self) -> None: ...


class Wheel:
    def __init__(
        self,
        store: SlotStore,
        cancels: CancelLog,
        reschedules: RescheduleLog,
        placement: Placement,
        outcomes: Outcomes,
        lookahead_s: float,
        takeover_s: float = 0.0,
        coverage: Coverage | None = None,
        clock: Clock = time.time,
        *,
        max_buffered_bytes: int = UNBOUNDED,
        horizon_s: int = DEFAULT_HORIZON_S,
    ) -> None:
        """`max_buffered_bytes` bounds what loading slots brings into memory (records
        the intake hands straight in come on top); `horizon_s` is how far ahead records
        are kept in slot files, and sets the tiers' widths."""
        self._store = store
        self._cancels = cancels
        self._reschedules = reschedules
        self.buffer = SlotBuffer(clock, keep=self._keep_or_stop)
        """What the forwarder takes from; its taker drops what must not go out."""
        self._placement = placement
        self._outcomes = outcomes
        self._lookahead = lookahead_s
        self._takeover = takeover_s
        self._coverage = coverage
        self._clock = clock
        self._lock = threading.Lock()
        self._tiers = Tiers.for_horizon(horizon_s)
        self._bounds = self._tiers.boundaries(clock())
        self._budget = max_buffered_bytes
        self._held = 0  # estimated bytes of records in memory
        self._cost: dict[SlotTracker, int] = {}  # estimated bytes per record, by slot
        self._loading: dict[SlotTracker, SlotIndex] = {}  # slots partly in memory
        self._trackers: dict[tuple[int, int], SlotTracker] = {}
        self._unloaded = store.slots()  # heap of (second, partition) on disk only
        heapq.heapify(self._unloaded)
        self._near: list[tuple[int, int]] = []  # unloaded, taken off the heap: due soon
        # Per partition, the first second of its earliest span: slots from there on
        # wait until that span is split, so a loaded slot never gains records on disk.
        self._span_floor: dict[int, int] = {}
        for partition, start, _ in store.spans():
            self._span_floor[partition] = min(start, self._span_floor.get(partition, start))
        self._marks: dict[SlotTracker, list[int]] = {}  # settled, not yet written
        # Cancels that removed their message, by the slot that held it: a cancel leaves
        # the cancel log only once the message's settled mark (or the slot's deletion)
        # is durable, so no crash can find the message on disk and its cancel gone.
        self._matches: dict[SlotTracker, list[str]] = {}
        self._matches_durable: list[str] = []  # marked or deleted, awaiting a sync
        self._in_memory: set[str] = set()  # ids loaded and not yet taken
        self._cancelled_in_memory: set[str] = set()
        self._recent = RecentIds(RECENTLY_FORWARDED)  # sent: later markers are too late
        self._called_off = RecentIds(RECENTLY_FORWARDED)  # removed by their cancel
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="precise-loader", daemon=True)
        self._splitter = threading.Thread(
            target=self._run_splits, name="precise-splitter", daemon=True
        )

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()
        self._splitter.start()

    def stop(self, timeout: float) -> None:
        self._stopping.set()
        self._wake.set()
        deadline = time.monotonic() + timeout
        self._thread.join(timeout)
        if self._splitter.is_alive():
            self._splitter.join(max(0.1, deadline - time.monotonic()))

    def is_alive(self) -> bool:
        return self._thread.is_alive() and self._splitter.is_alive()

    @property
    def loaded_slots(self) -> int:
        return len(self._trackers)

    @property
    def disk_slots(self) -> int:
        """Files on disk, slots and spans."""
        return self._store.file_count()

    @property
    def held_bytes(self) -> int:
        """Estimated bytes of the records this wheel holds in memory."""
        return self._held

    # -- intake side ---------------------------------------------------------------
    def append(self, partition: int, fire_ms: int, frame: bytes) -> SlotTracker | None:
        """`append_many` for one record."""
        return self.append_many([(partition, fire_ms, frame)])[0]

    def append_many(self, records: list[tuple[int, int, bytes]]) -> list[SlotTracker | None]:
        """Write framed records, (partition, fire_ms, frame) each, into their files, one
        write per file (durable at the store's next sync). Per record, its slot's
        tracker when the slot is in memory: the caller then buffers the record itself
        once the write is durable. None: it stays on disk until its slot is loaded."""
        with self._lock:
            return self._append_locked(records)

    def _append_locked(self, records: list[tuple[int, int, bytes]]) -> list[SlotTracker | None]:
        out: list[SlotTracker | None] = []
        writes: dict[Key, list[bytes]] = {}
        new: set[tuple[int, int]] = set()
        place, bounds = self._tiers.place, self._bounds
        for partition, fire_ms, frame in records:
            second = fire_ms // 1000
            start, width = place(second, bounds)
            writes.setdefault((partition, start, width), []).append(frame)
            out.append(None if width != 1 else self._slot_for(partition, second, frame, new))
        self._write(writes)
        return out

    def _slot_for(
        self, partition: int, second: int, frame: bytes, new: set[tuple[int, int]]
    ) -> SlotTracker | None:
        """The tracker a record of a slot joins, if its slot is in memory (lock held)."""
        key = (partition, second)
        tracker = self._trackers.get(key)
        if tracker is None and key not in new and self._store.size(partition, second) is None:
            new.add(key)  # a new file: in memory at once if near and no span covers it
            if second <= self._horizon() and second < self._span_floor.get(partition, UNBOUNDED):
                tracker = self._trackers[key] = SlotTracker(partition, second)
                self._cost[tracker] = len(frame) + RECORD_OVERHEAD
        if tracker is not None:
            tracker.outstanding += 1
            self._held += self._cost.get(tracker, RECORD_OVERHEAD)
        return tracker

    def _write(self, writes: dict[Key, list[bytes]]) -> None:
        """Append grouped frames; note the files this creates (lock held)."""
        for partition, start, width in self._store.append_many(writes):
            if width != 1:
                floor = self._span_floor.get(partition, UNBOUNDED)
                self._span_floor[partition] = min(floor, start)
            elif (partition, start) not in self._trackers:
                heapq.heappush(self._unloaded, (start, partition))
                if self._unloaded[0] == (start, partition):
                    self._wake.set()  # a new earliest slot: the loader may sleep less

    def admit(self, records: list[tuple[SlotRecord, float]]) -> None:
        """Buffer records of in-memory slots, once their writes are durable; a record
        read again whose message was moved since is settled instead."""
        with self._lock:
            stale = self._moved_away(record for record, _ in records)
            if stale:
                kept = []
                for item in records:
                    record = item[0]
                    if record.envelope and (record.envelope.id, record.offset()) in stale:
                        self._settle_locked(record.slot, record.offset())
                    else:
                        kept.append(item)
                records = kept
            for record, _ in records:
                if record.envelope is None:
                    continue
                message_id = record.envelope.id
                self._in_memory.add(message_id)
                if message_id in self._cancels:  # cancelled while its write became durable
                    self._cancelled_in_memory.add(message_id)
        self.buffer.schedule_many(records)

    def cancel(self, message_id: str, expires_ms: int) -> str:
        """Call off a message wherever it sits; returns what happened to the cancel.

        The cancel is written to the durable cancel log in every case but "too late",
        so a restart before the message's slot is deleted cannot bring it back.
        """
        with self._lock:
            if message_id in self._recent:
                return "too_late"
            if not self._cancels.add(message_id, expires_ms):
                return "refused"
            if message_id in self._in_memory:
                self._cancelled_in_memory.add(message_id)
            return "pending"

    def _moved_away(self, records: Iterable[SlotRecord]) -> set[tuple[str, int]]:
        """(id, offset) of the records a reschedule has made stale: another copy is live."""
        return self._reschedules.superseded(
            (record.envelope.id, record.offset(), False) for record in records if record.envelope
        )

    def move_many(self, requests: list[Reschedule]) -> list[tuple[str, SlotRecord | None]]:
        """Move pending messages to new due times: per request, its outcome ("moved",
        "too_late", "unmatched", "cancelled", "refused", or `READ_AGAIN` for a marker
        whose move, or a later one's, is done already) and the copy when it belongs in
        memory now (the caller buffers it, through `admit`, once its offset is
        committed).

        Each move writes a copy of the message due at the new time and then names it
        live in the reschedule log; the copies are synced before the log entries are
        written, and the entries before this returns, all under the wheel's lock. So no
        crash can leave an entry whose copy is not on disk (the message would be lost),
        and no old copy is taken for sending or settled as stale until its replacement
        is live. A crash before the entries leaves copies no entry names, which are
        never sent, and the marker is read again. Cancels win: a cancelled id is not
        moved, and a cancel after the move calls off the live copy.

        Holding the lock across the syncs delays the forwarder by one sync per batch
        that holds reschedules; a reschedule is rare next to what it moves."""
        wanted: dict[int, set[str]] = {}
        for request in requests:
            wanted.setdefault(request.partition, set()).add(request.message_id)
        found = self._find_locked_after(wanted)  # returns with the lock held
        try:
            out: list[tuple[str, SlotRecord | None]] = []
            moves: dict[str, Move] = {}  # this batch's entries, the last per id
            for request in requests:
                copies = found.setdefault((request.partition, request.message_id), [])
                outcome, stored, tracker = self._move_locked(request, copies, moves)
                held = None
                if stored is not None:
                    copies.append(stored)  # a later marker of the id in this batch moves it
                    if tracker is not None:
                        held = SlotRecord.stored(stored, request.partition, tracker)
                out.append((outcome, held))
            if moves:
                self._store.sync()  # the copies first: an entry must never name a lost copy
                for message_id, move in moves.items():
                    self._reschedules.move(message_id, move)
                self._reschedules.sync()
            return out
        finally:
            self._lock.release()

    def _find_locked_after(
        self, wanted: dict[int, set[str]]
    ) -> dict[tuple[int, str], list[StoredRecord]]:
        """The stored copies of the ids wanted, per (partition, id); returns holding the
        wheel's lock. The files are read outside the lock, which is then taken and the
        search repeated if a file appeared or a span went meanwhile (a split moved
        records into finer files); after `FIND_TRIES` such tries, it searches holding
        the lock. Slots that went are harmless: every record in them was settled."""
        for attempt in range(FIND_TRIES + 1):
            last = attempt == FIND_TRIES
            if last:
                self._lock.acquire()
            snapshot = {partition: self._store.files(partition) for partition in wanted}
            found: dict[tuple[int, str], list[StoredRecord]] = {}
            for partition, ids in wanted.items():
                copies = find_copies(snapshot[partition], self._store.read_at, ids)
                for message_id, stored in copies.items():
                    found[(partition, message_id)] = stored
            if last:
                return found
            self._lock.acquire()
            if not any(
                _moved_meanwhile(snapshot[partition], self._store.files(partition))
                for partition in wanted
            ):
                return found
            self._lock.release()
        raise AssertionError("unreachable")  # pragma: no cover

    def _move_locked(
        self, request: Reschedule, copies: list[StoredRecord], moves: dict[str, Move]
    ) -> tuple[str, StoredRecord | None, SlotTracker | None]:
        """One move's decision and its copy's write (lock held): the outcome, the copy
        as stored and its slot's tracker when the slot is in memory. The log entry
        goes into `moves`, to be written once the copies are durable."""
        message_id = request.message_id
        if message_id in self._cancels or message_id in self._called_off:
            return "cancelled", None, None
        if message_id in self._recent:
            return "too_late", None, None
        current = moves.get(message_id) or self._reschedules.current(message_id)
        if current is not None and current.version >= request.version:
            return READ_AGAIN, None, None  # after a restart: this marker, or a later one, moved it
        # The live copy: the entry's, else the message as first stored. Its settled
        # mark, or its file gone, means it was sent (the search skips both).
        live = [
            copy
            for copy in copies
            if (copy.offset == current.version if current is not None else not copy.copy)
        ]
        if not live:
            return "unmatched", None, None
        if not self._reschedules.has_room(message_id):
            return "refused", None, None
        stored = live[0]._replace(
            offset=request.version, due_ms=request.due_ms, replica=request.replica, copy=True
        )
        (tracker,) = self._append_locked([(request.partition, request.fire_ms, encode(stored))])
        takeover_ms = int(self._takeover * 1000)
        hold_ms = max(
            request.fire_ms,
            current.hold_ms if current is not None else 0,
            *(copy.due_ms + (takeover_ms if copy.replica else 0) for copy in copies),
        )
        moves[message_id] = Move(request.due_ms, request.version, hold_ms, request.partition)
        return "moved", stored, tracker

    # -- forwarder side ------------------------------------------------------------
    def _keep_or_stop(self, records: list[SlotRecord]) -> list[SlotRecord]:
        """`_keep`, on the forwarder's thread: a fault of the disk (reported through
        `on_fault`, the daemon is stopping) sends nothing; the records stay on disk."""
        try:
            return self._keep(records)
        except StorageError:
            return []

    def _keep(self, records: list[SlotRecord]) -> list[SlotRecord]:
        """Runs on the taking thread, just before the records are sent."""
        if not records:
            return records
        out: list[SlotRecord] = []
        settled: list[tuple[SlotTracker, int]] = []
        deferred: list[tuple[SlotRecord, float]] = []
        cancelled = 0
        now_ms = self._clock() * 1000
        replicas: dict[int, bool] = {}  # partition -> this member holds its replica
        sent: list[str] = []
        # An owner's record due before this may have been taken over meanwhile.
        overdue_before_ms = now_ms - self._takeover * 1000
        coverage = self._coverage
        with self._lock:
            in_memory, cancelled_in_memory = self._in_memory, self._cancelled_in_memory
            stale = self._moved_away(records)
            for record in records:
                envelope = record.envelope
                tracker = record.slot
                if envelope is None or not isinstance(tracker, SlotTracker):
                    out.append(record)  # a dead letter from the intake, or a retry of one
                    continue
                message_id = envelope.id
                if stale and (message_id, record.offset()) in stale:
                    settled.append((tracker, record.offset()))  # moved: another copy is live
                    continue
                in_memory.discard(message_id)
                if message_id in cancelled_in_memory:
                    cancelled_in_memory.discard(message_id)
                    # Match and mark under one hold of the lock, so no write of marks
                    # in between can retire the cancel before its message's mark.
                    self._matches.setdefault(tracker, []).append(message_id)
                    self._settle_locked(tracker, record.offset())
                    cancelled += 1
                    continue
                partition = record.partition()
                replica = replicas.get(partition)
                if replica is None:
                    replica = replicas[partition] = self._placement.role(partition) is Role.REPLICA
                overdue = record.due_ms < overdue_before_ms
                if (replica or overdue) and coverage is not None:
                    if not coverage.ready:  # just started: the other's word is not read yet
                        deferred.append((record, now_ms / 1000 + NOT_READY_RETRY_S))
                        in_memory.add(message_id)
                        continue
                    if coverage.covers(record.partition(), record.offset(), record.due_ms):
                        self._outcomes.cleaned()
                        settled.append((tracker, record.offset()))
                        continue
                if replica:
                    self._outcomes.took_over()
                sent.append(message_id)
                out.append(record)
            self._recent.add_all(sent)
        self._kept(cancelled, settled, deferred)
        return out

    def _kept(
        self,
        cancelled: int,
        settled: list[tuple[SlotTracker, int]],
        deferred: list[tuple[SlotRecord, float]],
    ) -> None:
        """What `_keep` held back: count the cancelled, settle the covered and hold the
        deferred again (outside the lock)."""
        if cancelled:
            self._outcomes.cancelled("cancelled", cancelled)
        for tracker, offset in settled:
            self.settled(tracker, offset)
        if deferred:
            self.buffer.schedule_many(deferred)

    def settled(self, tracker: SlotTracker, offset: int) -> None:
        """One record of a loaded slot is done: delete the file with the last one, and
        until then mark the record settled in it (written in batches, `MARKS_EVERY_S`),
        so a restart does not send it again."""
        self.settle_many([(tracker, offset)])

    def settle_many(self, done: list[tuple[SlotTracker, int]]) -> None:
        """`settled` for many records (those a commit point made durable), in one hold
        of the lock."""
        with self._lock:
            for tracker, offset in done:
                self._settle_locked(tracker, offset)

    def _settle_locked(self, tracker: SlotTracker, offset: int) -> None:
        tracker.outstanding -= 1
        self._held -= self._cost.get(tracker, RECORD_OVERHEAD)
        if tracker.deleted:
            return
        if tracker.outstanding <= 0 and not tracker.loading:
            self._delete(tracker)
        else:
            self._marks.setdefault(tracker, []).append(offset)

    def write_marks(self) -> None:
        """Append the settled marks gathered since the last call, one write per slot;
        then retire the cancels whose messages those marks (or deletions) settled."""
        with self._lock:
            marks, self._marks = self._marks, {}
            for tracker, offsets in marks.items():
                if not tracker.deleted:
                    frames = b"".join(map(encode_settled, offsets))
                    self._store.append(tracker.partition, tracker.second, frames)
                self._matches_durable.extend(self._matches.pop(tracker, ()))
            retire, self._matches_durable = self._matches_durable, []
        if retire:
            self._retire(retire)

    def _retire(self, message_ids: list[str]) -> None:
        """Drop matched cancels from the log once the marks or deletions that settled
        their messages are durable. A failed sync keeps them: a kept cancel only waits
        for its expiry, a dropped one could let its message out after a restart."""
        try:
            self._store.sync()
        except Exception:
            with self._lock:
                self._matches_durable.extend(message_ids)
            raise
        self.retire_cancels(message_ids)

    def retire_cancels(self, message_ids: list[str]) -> None:
        """Drop cancels whose messages are gone for good, remembering the ids for a
        while so that a reschedule after them is told the message was cancelled."""
        with self._lock:
            self._called_off.add_all(message_ids)
        for message_id in message_ids:
            self._cancels.matched(message_id)

    def _delete(self, tracker: SlotTracker) -> None:
        tracker.deleted = True
        self._marks.pop(tracker, None)
        self._matches_durable.extend(self._matches.pop(tracker, ()))
        self._trackers.pop((tracker.partition, tracker.second), None)
        self._cost.pop(tracker, None)
        self._store.delete(tracker.partition, tracker.second)

    # -- loader --------------------------------------------------------------------
    def _horizon(self) -> int:
        """The last slot second that belongs in memory now."""
        return int((self._clock() + self._lookahead) // 1)

    def _run(self) -> None:
        next_expiry = 0.0
        while not self._stopping.is_set():
            try:
                wait = self._load_due_slots()
                self.write_marks()
                if time.monotonic() >= next_expiry:
                    next_expiry = time.monotonic() + EXPIRE_EVERY_S
                    self._expire_cancels()
                self._wake.wait(min(wait, MARKS_EVERY_S) if wait is not None else MARKS_EVERY_S)
                self._wake.clear()
            except StorageError as fault:  # reported by the store: the daemon is stopping
                log.debug("precise loader stops on a storage fault: %s", fault)
                return
            except Exception:
                log.exception("precise loader: unexpected error; continuing")
                self._stopping.wait(1.0)
        try:
            self.write_marks()
        except StorageError as fault:
            log.debug("precise loader: last settled marks not written: %s", fault)

    def _next_to_load(self) -> tuple[int, int] | float | None:
        """The slot to load now, else seconds until one is due to be (None: none on
        disk). A slot loads `lookahead` before its second, and earlier by its size, but
        not while a span that may hold more of its records waits to be split."""
        now = self._clock()
        horizon = now + self._lookahead
        while self._unloaded and self._unloaded[0][0] <= horizon + MAX_LEAD_S:
            self._near.append(heapq.heappop(self._unloaded))
        wait: float | None = None
        for index, (second, partition) in enumerate(self._near):
            if second >= self._span_floor.get(partition, UNBOUNDED):
                wait = MARKS_EVERY_S if wait is None else min(wait, MARKS_EVERY_S)
                continue  # its span is being split: asked again shortly
            size = self._store.size(partition, second) or 0
            start = second - self._lookahead - min(MAX_LEAD_S, size / LOAD_BYTES_PER_S)
            if start <= now:
                return self._near.pop(index)
            wait = start - now if wait is None else min(wait, start - now)
        if self._unloaded:
            head = self._unloaded[0][0] - horizon - MAX_LEAD_S
            wait = head if wait is None else min(wait, head)
        return wait

    def _load_due_slots(self) -> float | None:
        """Index every slot that is due to be loaded, and bring records of the slots
        being loaded into memory while the budget allows; seconds until the next slot
        is due to be (None: none on disk)."""
        wait: float | None = None
        while not self._stopping.is_set():
            with self._lock:
                chosen = self._next_to_load()
                if not isinstance(chosen, tuple):
                    wait = chosen
                    break
                second, partition = chosen
                # From here on appends to the slot go to memory by the intake; the
                # file's size now marks what the index below covers.
                tracker = self._trackers[(partition, second)] = SlotTracker(partition, second)
                tracker.loading = True
                size = self._store.size(partition, second) or 0
            index = SlotIndex(
                functools.partial(self._store.read_at, (partition, second, 1)),
                size,
                second,
                int(self._takeover * 1000),
            )
            with self._lock:
                self._cost[tracker] = index.frame_bytes + RECORD_OVERHEAD
                self._loading[tracker] = index
                self._held += index.memory
        return 0.0 if self._fill() else wait

    def _fill(self) -> bool:
        """Bring records of the slots being loaded into memory, earliest slot first and
        in due order within it, while the records held stay under the budget; records
        already due are read even above it when the forwarder is about to run dry, so
        the wheel never stalls on its own memory (records in flight to their targets
        count until acknowledged). True: stopped after `FILL_SLICE_S` with more to read
        now."""
        until = time.monotonic() + FILL_SLICE_S
        while self._loading and not self._stopping.is_set():
            if time.monotonic() >= until:
                return True
            tracker = min(self._loading, key=lambda t: t.second)
            index = self._loading[tracker]
            millisecond = index.next_millisecond()
            room = self._budget - self._held
            cost = self._cost.get(tracker, RECORD_OVERHEAD)
            if millisecond is not None and room < cost:
                due = tracker.second * 1000 + millisecond <= self._clock() * 1000
                if not due or len(self.buffer) >= LOAD_AT_MOST:
                    return False  # over budget: wait for records to leave
                room = cost * LOAD_AT_MOST // 10  # the forwarder would run dry
            count = min(LOAD_AT_MOST, max(1, room // cost))
            stored = index.take(count) if millisecond is not None else []
            records, cancelled = self._admit_loaded(tracker, stored, finished=not index)
            if cancelled:
                self._outcomes.cancelled("cancelled", cancelled)
            if records:
                self.buffer.schedule_many(records)
        return False

    def _admit_loaded(
        self, tracker: SlotTracker, stored: list[StoredRecord], finished: bool
    ) -> tuple[list[tuple[SlotRecord, float]], int]:
        """Records read from a slot, as the forwarder's buffer takes them; drops the
        cancelled (a settled mark each). With the last of the slot, it stops loading."""
        partition, second = tracker.partition, tracker.second
        takeover = self._takeover
        # Built outside the lock, which the forwarder takes before every send.
        out = [
            (
                SlotRecord.stored(item, partition, tracker),
                item.due_ms / 1000 + (takeover if item.replica else 0.0),
            )
            for item in stored
        ]
        cancelled = 0
        with self._lock:
            stale = self._reschedules.superseded(
                (item.message_id, item.offset, item.copy) for item in stored
            )
            if stale:  # moved: settled unsent, and no cancel of theirs is matched by it
                kept = []
                kept_stored = []
                for item, held in zip(stored, out, strict=True):
                    if (item.message_id, item.offset) in stale:
                        self._marks.setdefault(tracker, []).append(item.offset)
                    else:
                        kept.append(held)
                        kept_stored.append(item)
                out, stored = kept, kept_stored
            called_off = self._cancels.among(item.message_id for item in stored)
            if called_off:
                kept = []
                for item, held in zip(stored, out, strict=True):
                    if item.message_id in called_off:
                        self._matches.setdefault(tracker, []).append(item.message_id)
                        self._marks.setdefault(tracker, []).append(item.offset)
                        cancelled += 1
                    else:
                        kept.append(held)
                out = kept
            self._in_memory.update(record.envelope.id for record, _ in out if record.envelope)
            cost = self._cost.get(tracker, RECORD_OVERHEAD)
            tracker.outstanding += len(out)
            self._held += cost * len(out)
            if finished:
                index = self._loading.pop(tracker, None)
                if index is not None:
                    self._held -= index.memory
                tracker.loading = False
                if tracker.outstanding <= 0:
                    self._delete(tracker)
                log.debug("loaded slot %d of partition %d", second, partition)
        return out, cancelled

    # -- splitter ------------------------------------------------------------------
    def _run_splits(self) -> None:
        """Splits spans as they come near; now and then, while little is held, gives
        freed heap back."""
        next_trim = 0.0
        while not self._stopping.is_set():
            try:
                self.split_due_spans()
                if time.monotonic() >= next_trim and self._held < TRIM_BELOW:
                    next_trim = time.monotonic() + TRIM_EVERY_S
                    release_free_heap()
            except StorageError as fault:  # reported by the store: the daemon is stopping
                log.debug("precise splitter stops on a storage fault: %s", fault)
                return
            except Exception:
                log.exception("precise splitter: unexpected error; continuing")
            self._stopping.wait(SPLIT_EVERY_S)

    def split_due_spans(self) -> int:
        """Move the boundaries to now, and split every span they have passed, earliest
        first, into finer files. Returns the spans split."""
        done = 0
        while not self._stopping.is_set():
            with self._lock:
                bounds = self._tiers.boundaries(self._clock())
                self._bounds = tuple(map(max, self._bounds, bounds))
                due = [
                    span
                    for span in self._store.spans()
                    if self._tiers.due_for_split(span[1], span[2], self._bounds)
                ]
                if not due:
                    return done
                span = min(due, key=lambda key: (key[1], key[2]))
                size = self._store.size(*span) or 0  # nothing more is appended to it
            copied = split(self._store, span, size, int(self._takeover * 1000), self._place)
            with self._lock:
                self._span_floor.pop(span[0], None)
                for partition, start, _ in self._store.spans():
                    if partition == span[0]:
                        floor = self._span_floor.get(partition, UNBOUNDED)
                        self._span_floor[partition] = min(floor, start)
            log.debug("split span %s: %d records into finer files", span, copied)
            done += 1
            self._wake.set()  # its slots may be loadable now
        return done

    def _place(self, span: Key, by_second: dict[int, list[bytes]]) -> None:
        """Write one chunk of a span into the files the boundaries give now."""
        partition = span[0]
        writes: dict[Key, list[bytes]] = {}
        with self._lock:
            place, bounds = self._tiers.place, self._bounds
            for second, frames in by_second.items():
                start, width = place(second, bounds)
                writes.setdefault((partition, start, width), []).extend(frames)
            self._write(writes)

    def _expire_cancels(self) -> None:
        expired = self._cancels.expire(int(self._clock() * 1000))
        if expired:
            self._outcomes.cancelled("unmatched", len(expired))
        with self._lock:  # no copy is written while the files are looked at
            self._reschedules.expire(self._store.earliest())
