"""The single-layer wheel: one file per 1 s slot on disk, the slots near the pointer
in memory.

The source material keeps it single-layer on purpose: a slot file is only appended to
or deleted whole, never demoted into a finer wheel, so there is no metadata to keep
consistent between layers. Memory holds only the slots within the look-ahead of now;
everything further out is a file with no open handle, so a backlog of days costs disk,
not RAM. A slot is read whole when the pointer comes near it, its records wait in a
heap ordered by due millisecond, and its file is deleted once every record in it is
settled (forwarded, dead-lettered, cancelled or, for a replica's copy, reported done
by the owner).

Threads: the intake thread appends, the loader thread (here) reads slots in, the
forwarder takes due records; one lock orders appends against loads and deletes, so a
record is in memory exactly once.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, Protocol

from delayservice.envelope import Envelope, Headers
from delayservice.precise.cancel_log import CancelLog
from delayservice.precise.placement import Placement, Role
from delayservice.precise.slot_file import StoredRecord, encode_settled
from delayservice.precise.slot_ledger import SlotTracker
from delayservice.precise.slot_store import SlotStore
from delayservice.timers.base import Clock
from delayservice.timers.delay_queue import DelayQueue
from delayservice.worker.record import HeldRecord, record_size

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
"""Ids of records lately sent, so a cancel that comes after can be told it is too late."""
EXPIRE_EVERY_S: Final = 60.0


class Coverage(Protocol):
    """What the other holder of a partition has reported settled (replicas only)."""

    @property
    def ready(self) -> bool: ...

    def covers(self, partition: int, offset: int, due_ms: int) -> bool: ...


NOT_READY_RETRY_S: Final = 0.5
"""How soon a copy waiting for the other holder's reports to be read is looked at again."""


class Outcomes(Protocol):
    """Counters the wheel reports to; the metrics object provides them."""

    def cancelled(self, outcome: str, count: int = 1) -> None: ...

    def cleaned(self) -> None: ...

    def took_over(self) -> None: ...


TAKE_AT_MOST: Final = 5_000
"""Records handed to the forwarder per take: a burst due at one instant starts going out
at once instead of after all of it was popped and filtered."""


class WheelBuffer(DelayQueue[HeldRecord]):
    """The forwarder's buffer: a heap whose taker drops what must not go out any more
    (cancelled since it was loaded, or a replica's copy the owner reported done)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.keep: Callable[[list[HeldRecord]], list[HeldRecord]] = lambda records: records

    def take_expired(self, timeout: float | None = None) -> list[HeldRecord]:
        """Like the heap's, but at most `TAKE_AT_MOST` at a time (the forwarder comes
        straight back for more while any are due)."""
        with self._cond:
            now = self._await_due(timeout)
            records = [] if now is None else self._pop_due(now, TAKE_AT_MOST)
        return self.keep(records)


class Wheel:
    def __init__(
        self,
        store: SlotStore,
        cancels: CancelLog,
        buffer: WheelBuffer,
        placement: Placement,
        outcomes: Outcomes,
        lookahead_s: float,
        takeover_s: float = 0.0,
        coverage: Coverage | None = None,
        clock: Clock = time.time,
    ) -> None:
        self._store = store
        self._cancels = cancels
        self.buffer = buffer
        buffer.keep = self._keep
        self._placement = placement
        self._outcomes = outcomes
        self._lookahead = lookahead_s
        self._takeover = takeover_s
        self.coverage = coverage
        self._clock = clock
        self._lock = threading.Lock()
        self._trackers: dict[tuple[int, int], SlotTracker] = {}
        self._unloaded: list[tuple[int, int]] = []  # heap of (second, partition) on disk only
        self._unloaded_set: set[tuple[int, int]] = set()
        for second, partition in store.slots():
            self._unloaded.append((second, partition))
            self._unloaded_set.add((partition, second))
        heapq.heapify(self._unloaded)
        self._near: list[tuple[int, int]] = []  # unloaded, taken off the heap: due soon
        self._marks: dict[SlotTracker, list[int]] = {}  # settled, not yet written
        # Cancels that removed their message, by the slot that held it: a cancel leaves
        # the cancel log only once the message's settled mark (or the slot's deletion)
        # is durable, so no crash can find the message on disk and its cancel gone.
        self._matches: dict[SlotTracker, list[str]] = {}
        self._matches_durable: list[str] = []  # marked or deleted, awaiting a sync
        self._in_memory: set[str] = set()  # ids loaded and not yet taken
        self._cancelled_in_memory: set[str] = set()
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="precise-loader", daemon=True)

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def loaded_slots(self) -> int:
        return len(self._trackers)

    @property
    def disk_slots(self) -> int:
        return len(self._unloaded_set) + len(self._trackers)

    def earliest_unsettled_ms(self) -> dict[int, int]:
        """Per partition, the start of its earliest slot that still has a file (loaded or
        not): every record of the partition due before it has been settled. One pass for
        all partitions, since a backlog of days is hundreds of thousands of slots."""
        earliest: dict[int, int] = {}
        with self._lock:
            for keys in (self._trackers, self._unloaded_set):
                for partition, second in keys:
                    if second < earliest.get(partition, second + 1):
                        earliest[partition] = second
        return {partition: second * 1000 for partition, second in earliest.items()}

    # -- intake side ---------------------------------------------------------------
    def append(self, partition: int, fire_ms: int, frame: bytes) -> SlotTracker | None:
        """Write one framed record into its slot file (durable at the store's next
        sync). Returns the slot's tracker when the slot is in memory: the caller then
        buffers the record itself once the write is durable. None: it stays on disk
        until the loader reads its slot."""
        second = fire_ms // 1000
        key = (partition, second)
        with self._lock:
            self._store.append(partition, second, frame)
            tracker = self._trackers.get(key)
            if tracker is None and key not in self._unloaded_set:
                if second <= self._horizon():
                    tracker = self._trackers[key] = SlotTracker(partition, second)
                else:
                    self._unloaded_set.add(key)
                    heapq.heappush(self._unloaded, (second, partition))
                    if self._unloaded[0] == (second, partition):
                        self._wake.set()  # a new earliest slot: the loader may sleep less
            if tracker is not None:
                tracker.outstanding += 1
            return tracker

    def admit(self, records: list[tuple[HeldRecord, float]]) -> None:
        """Buffer records of in-memory slots, once their writes are durable."""
        with self._lock:
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

    # -- forwarder side ------------------------------------------------------------
    def _keep(self, records: list[HeldRecord]) -> list[HeldRecord]:
        """Runs on the taking thread, just before the records are sent."""
        if not records:
            return records
        out: list[HeldRecord] = []
        settled: list[tuple[SlotTracker, int]] = []
        deferred: list[tuple[HeldRecord, float]] = []
        cancelled = 0
        now_ms = self._clock() * 1000
        with self._lock:
            for record in records:
                envelope = record.envelope
                tracker = record.ledger
                if envelope is None or not isinstance(tracker, SlotTracker):
                    out.append(record)  # a dead letter from the intake, or a retry of one
                    continue
                message_id = envelope.id
                self._in_memory.discard(message_id)
                if message_id in self._cancelled_in_memory:
                    self._cancelled_in_memory.discard(message_id)
                    # Match and mark under one hold of the lock, so no write of marks
                    # in between can retire the cancel before its message's mark.
                    self._matches.setdefault(tracker, []).append(message_id)
                    self._settle_locked(tracker, record.offset)
                    cancelled += 1
                    continue
                replica = self._placement.role(record.partition) is Role.REPLICA
                # An owner's record this overdue may have been taken over meanwhile.
                overdue = now_ms - record.due_ms > self._takeover * 1000
                coverage = self.coverage
                if (replica or overdue) and coverage is not None:
                    if not coverage.ready:  # just started: the other's word is not read yet
                        deferred.append((record, now_ms / 1000 + NOT_READY_RETRY_S))
                        self._in_memory.add(message_id)
                        continue
                    if coverage.covers(record.partition, record.offset, record.due_ms):
                        self._outcomes.cleaned()
                        settled.append((tracker, record.offset))
                        continue
                if replica:
                    self._outcomes.took_over()
                self._remember(message_id)
                out.append(record)
        if cancelled:
            self._outcomes.cancelled("cancelled", cancelled)
        for tracker, offset in settled:
            self.settled(tracker, offset)
        if deferred:
            self.buffer.schedule_many(deferred)
        return out

    def _remember(self, message_id: str) -> None:
        recent = self._recent
        recent[message_id] = None
        if len(recent) > RECENTLY_FORWARDED:
            recent.popitem(last=False)

    def settled(self, tracker: SlotTracker, offset: int) -> None:
        """One record of a loaded slot is done: delete the file with the last one, and
        until then mark the record settled in it (written in batches, `MARKS_EVERY_S`),
        so a restart does not send it again."""
        with self._lock:
            self._settle_locked(tracker, offset)

    def _settle_locked(self, tracker: SlotTracker, offset: int) -> None:
        tracker.outstanding -= 1
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
        for message_id in message_ids:
            self._cancels.matched(message_id)

    def _delete(self, tracker: SlotTracker) -> None:
        tracker.deleted = True
        self._marks.pop(tracker, None)
        self._matches_durable.extend(self._matches.pop(tracker, ()))
        self._trackers.pop((tracker.partition, tracker.second), None)
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
            except Exception:
                log.exception("precise loader: unexpected error; continuing")
                self._stopping.wait(1.0)
        self.write_marks()

    def _next_to_load(self) -> tuple[int, int] | float | None:
        """The slot to load now, else seconds until one is due to be (None: none on
        disk). A slot loads `lookahead` before its second, and earlier by its size."""
        now = self._clock()
        horizon = now + self._lookahead
        while self._unloaded and self._unloaded[0][0] <= horizon + MAX_LEAD_S:
            self._near.append(heapq.heappop(self._unloaded))
        wait: float | None = None
        for index, (second, partition) in enumerate(self._near):
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
        """Load every slot that is due to be; seconds until the next one is."""
        while not self._stopping.is_set():
            with self._lock:
                chosen = self._next_to_load()
                if not isinstance(chosen, tuple):
                    return chosen
                second, partition = chosen
                self._unloaded_set.discard((partition, second))
                # From here on appends to the slot go to memory by the intake; the
                # file's size now marks what the read below covers.
                tracker = self._trackers[(partition, second)] = SlotTracker(partition, second)
                tracker.loading = True
                size = self._store.size(partition, second)
            records, cancelled = self._load(tracker, size)
            if cancelled:
                self._outcomes.cancelled("cancelled", cancelled)
            if records:
                self.buffer.schedule_many(records)
        return None

    def _load(
        self, tracker: SlotTracker, size: int | None
    ) -> tuple[list[tuple[HeldRecord, float]], int]:
        """Read a slot into memory. Decoding a big slot (a burst due in one second) takes
        seconds, so it runs without the lock; the intake keeps appending meanwhile."""
        partition, second = tracker.partition, tracker.second
        stored = self._store.read(partition, second, size) if size else []
        seen: set[int] = set()
        loaded: list[tuple[HeldRecord, float]] = []
        for item in stored:
            if item.offset in seen:
                continue  # written twice: re-read after a crash between write and commit
            seen.add(item.offset)
            fire = item.due_ms / 1000 + (self._takeover if item.replica else 0.0)
            loaded.append((held(item, tracker, partition), fire))
        out: list[tuple[HeldRecord, float]] = []
        cancelled = 0
        with self._lock:
            cancels, in_memory = self._cancels, self._in_memory
            for entry in loaded:
                message_id = entry[0].envelope.id  # type: ignore[union-attr]  # held() sets it
                if message_id in cancels:
                    self._matches.setdefault(tracker, []).append(message_id)
                    self._marks.setdefault(tracker, []).append(entry[0].offset)
                    cancelled += 1
                    continue
                in_memory.add(message_id)
                out.append(entry)
            tracker.outstanding += len(out)
            tracker.loading = False
            if tracker.outstanding <= 0:
                self._delete(tracker)
        if stored:
            log.debug("loaded slot %d of partition %d: %d records", second, partition, len(out))
        return out, cancelled

    def _expire_cancels(self) -> None:
        expired = self._cancels.expire(int(self._clock() * 1000))
        if expired:
            self._outcomes.cancelled("unmatched", len(expired))


def held(item: StoredRecord, tracker: SlotTracker, partition: int) -> HeldRecord:
    """A stored record back in the shape the forwarder sends."""
    headers: Headers = list(item.headers)
    return HeldRecord(
        tracker,
        partition,
        item.offset,
        item.key,
        item.value,
        headers,
        record_size(item.key, item.value, headers),
        Envelope(item.target, item.delay_ms, item.message_id, item.target_partition),
        item.due_ms,
    )
