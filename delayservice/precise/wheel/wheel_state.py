"""What the wheel's parts share: the slots in memory, the records held, and one lock.

The wheel (`wheel`) is put together from a part per job, each in a module of its own:
loading slots (`slot_loading`), splitting spans (`span_splitting`), handing due records
to the forwarder (`slot_taking`) and moving messages for reschedules
(`reschedule_moves`). They share this state and the few operations that change it:
appending framed records to their files, settling a record, deleting a slot's file.
One lock orders appends against loads, splits, moves and deletes, so a record is in
memory exactly once. Settled marks are gathered under it and written after it is let go
(`flush_marks`, on the marks writer's thread): a slow write holds up no forward.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Iterable
from typing import Final, Protocol

from delayservice.clock import Clock
from delayservice.precise.placement import Placement, Role
from delayservice.precise.storage.reschedule_log import RescheduleLog
from delayservice.precise.storage.slot_file import encode_settled, frame_offset
from delayservice.precise.storage.slot_index import SlotIndex
from delayservice.precise.storage.slot_record import SlotRecord
from delayservice.precise.storage.slot_store import Key, SlotStore
from delayservice.precise.wheel.held_bytes import HeldBytes
from delayservice.precise.wheel.recent_ids import RecentIds
from delayservice.precise.wheel.slot_buffer import SlotBuffer
from delayservice.precise.wheel.slot_ledger import SlotTracker
from delayservice.precise.wheel.tiers import Tiers

RECENTLY_FORWARDED: Final = 100_000
"""Ids of records lately sent, and of those lately called off, kept (at least the last
half this many, at most this many), so a marker that comes after can be told so."""
RECORD_OVERHEAD: Final = 900
"""Bytes a held record costs in memory beyond its frame: the record, its envelope, the
key, value and header objects and its heap row (about 610 B by tracemalloc on CPython
3.11), and its share of the client's send buffers while in flight (the rest of the
1.1 KB per held record a 500,000 burst cost in resident memory)."""
UNBOUNDED: Final = 2**62


class Coverage(Protocol):
    """What the other holder of a partition has reported settled (replicas only)."""

    @property
    def ready(self) -> bool: ...

    def covers(self, partition: int, offset: int, due_ms: int) -> bool: ...


class Delivered(Protocol):
    """Exactly-once: what transactions that committed before this producer took over
    delivered (`delivery_log.DeliveryLog`)."""

    def sent(self, partition: int, offset: int) -> bool: ...


class Takeover(Protocol):
    """Two copies, exactly-once: a replica's copies go out through a forwarder of their
    own, under the owner's transactional id (`precise_worker`), so the owner and its
    replica can never both commit a delivery."""

    @property
    def delivered(self) -> Delivered:
        """What transactions under the owner's id delivered, as that forwarder learned
        it."""
        ...

    def catch_up(self) -> None:
        """Before copies that look uncovered fence the owner: let the reader of the
        owner's word read what was written so far (bounded; never raises)."""
        ...

    def ready(self) -> float:
        """Called on that forwarder's thread with copies to send: 0 once its producer is
        initialised (which fenced the owner) and it has learned what committed before;
        else the seconds to hold them (fenced lately: the owner is back). Raises as
        `Transaction.init`."""
        ...


class Outcomes(Protocol):
    """Counters the wheel reports to; the metrics object provides them."""

    def cancelled(self, outcome: str, count: int = 1) -> None: ...

    def cleaned(self) -> None: ...

    def took_over(self) -> None: ...


class WheelState:
    """Built once, by `Wheel.__init__` (the arguments are described there), and handed
    to each part of the wheel, so what a part may touch shows in its constructor. It
    holds what the operations below use; a part is given the rest it needs itself."""

    buffer: SlotBuffer
    takeover_buffer: SlotBuffer | None
    """Two copies, exactly-once: the replica's copies, for the takeover forwarder."""

    def __init__(
        self,
        store: SlotStore,
        reschedules: RescheduleLog,
        placement: Placement,
        clock: Clock,
        lookahead_s: float,
        horizon_s: int,
        held: HeldBytes,
        unread: Iterable[int],
    ) -> None:
        self.store = store
        self.reschedules = reschedules
        self.placement = placement
        self.clock = clock
        self.lookahead_s = lookahead_s
        self.lock = threading.Lock()
        self.tiers = Tiers.for_horizon(horizon_s)
        self.bounds = self.tiers.boundaries(clock())
        self.shared = held  # the byte cap, maybe shared with the other wheel
        self.held = 0  # estimated bytes of records this wheel holds in memory
        held.add_holder(lambda: self.held)
        self.cost: dict[SlotTracker, int] = {}  # estimated bytes per record, by slot
        self.loading: dict[SlotTracker, SlotIndex] = {}  # slots partly in memory
        self.trackers: dict[tuple[int, int], SlotTracker] = {}
        self.unloaded = store.slots()  # heap of (second, partition) on disk only
        heapq.heapify(self.unloaded)
        self.near: list[tuple[int, int]] = []  # unloaded, taken off the heap: due soon
        # Per partition, the first second of its earliest span: slots from there on
        # wait until that span is split, so a loaded slot never gains records on disk.
        self.span_floor: dict[int, int] = {}
        for partition, start, _ in store.spans():
            self.span_floor[partition] = min(start, self.span_floor.get(partition, start))
        self.unread: set[int] = set(unread)
        """Partitions whose slots stay, even when finished, until the intake has read a
        batch again (`Wheel.read_again`)."""
        self.marks: dict[SlotTracker, list[int]] = {}  # settled, not yet written
        self.after_marks: list[Callable[[], None]] = []  # to run once they are
        self.flush_lock = threading.Lock()  # one `flush_marks` at a time
        self.marks_wanted = threading.Event()  # wakes the marks writer
        self.marks_writer: threading.Thread | None = None  # while it runs
        # Cancels that removed their message, by the slot that held it: a cancel leaves
        # the cancel log only once the message's settled mark (or the slot's deletion)
        # is durable, so no crash can find the message on disk and its cancel gone.
        self.matches: dict[SlotTracker, list[str]] = {}
        self.matches_durable: list[str] = []  # marked or deleted, awaiting a sync
        self.in_memory: set[str] = set()  # ids loaded and not yet taken
        self.cancelled_in_memory: set[str] = set()
        self.recent = RecentIds(RECENTLY_FORWARDED)  # sent: later markers are too late
        self.called_off = RecentIds(RECENTLY_FORWARDED)  # removed by their cancel
        self.wake = threading.Event()
        self.stopping = threading.Event()

    def schedule(self, items: list[tuple[SlotRecord, float]]) -> None:
        """Hand records to the buffer of the forwarder that sends them: a replica's
        copies go to the takeover forwarder's when there is one."""
        takeover = self.takeover_buffer
        if takeover is None or not items:
            self.buffer.schedule_many(items)
            return
        role = self.placement.role
        replica: dict[int, bool] = {}
        mine: list[tuple[SlotRecord, float]] = []
        copies: list[tuple[SlotRecord, float]] = []
        for item in items:
            partition = item[0].partition()
            is_copy = replica.get(partition)
            if is_copy is None:
                is_copy = replica[partition] = role(partition) is Role.REPLICA
            (copies if is_copy else mine).append(item)
        self.buffer.schedule_many(mine)
        takeover.schedule_many(copies)

    def buffered(self) -> int:
        """Records in the forwarders' buffers."""
        takeover = self.takeover_buffer
        return len(self.buffer) + (len(takeover) if takeover is not None else 0)

    def horizon(self) -> int:
        """The last slot second that belongs in memory now."""
        return int((self.clock() + self.lookahead_s) // 1)

    def append_locked(
        self, records: list[tuple[int, int, bytes]], *, once: bool = False
    ) -> list[SlotTracker | None]:
        """Write framed records, (partition, fire_ms, frame) each; per record its slot's
        tracker when the slot is in memory. `once`: the records are the intake's, and
        one whose slot is in memory with a copy of it already (read again after a
        crash) is neither written nor held again (None)."""
        out: list[SlotTracker | None] = []
        writes: dict[Key, list[bytes]] = {}
        new: set[tuple[int, int]] = set()
        place, bounds, trackers = self.tiers.place, self.bounds, self.trackers
        for partition, fire_ms, frame in records:
            second = fire_ms // 1000
            start, width = place(second, bounds)
            if width != 1:
                out.append(None)
            else:
                tracker = trackers.get((partition, second))
                on_file = None if tracker is None else tracker.on_file
                if once and on_file is not None and not on_file.first_copy(frame_offset(frame)):
                    out.append(None)
                    continue  # held already: read again after a crash
                out.append(self._slot_for(partition, second, frame, new, tracker))
            writes.setdefault((partition, start, width), []).append(frame)
        self.write(writes)
        return out

    def _slot_for(
        self,
        partition: int,
        second: int,
        frame: bytes,
        new: set[tuple[int, int]],
        tracker: SlotTracker | None,
    ) -> SlotTracker | None:
        """The tracker a record of a slot joins, if its slot is in memory (lock held);
        `tracker` is the slot's now, if any."""
        key = (partition, second)
        if tracker is None and key not in new and self.store.size(partition, second) is None:
            new.add(key)  # a new file: in memory at once if near and no span covers it
            if second <= self.horizon() and second < self.span_floor.get(partition, UNBOUNDED):
                tracker = self.trackers[key] = SlotTracker(partition, second)
                self.cost[tracker] = len(frame) + RECORD_OVERHEAD
        if tracker is not None:
            tracker.outstanding += 1
            self.held += self.cost.get(tracker, RECORD_OVERHEAD)
        return tracker

    def write(self, writes: dict[Key, list[bytes]]) -> None:
        """Append grouped frames; note the files this creates (lock held)."""
        for partition, start, width in self.store.append_many(writes):
            if width != 1:
                floor = self.span_floor.get(partition, UNBOUNDED)
                self.span_floor[partition] = min(floor, start)
            elif (partition, start) not in self.trackers:
                heapq.heappush(self.unloaded, (start, partition))
                if self.unloaded[0] == (start, partition):
                    self.wake.set()  # a new earliest slot: the loader may sleep less

    def settle_locked(self, tracker: SlotTracker, offset: int) -> None:
        tracker.outstanding -= 1
        self.held -= self.cost.get(tracker, RECORD_OVERHEAD)
        if tracker.deleted:
            return
        if self.finished(tracker):
            self.delete(tracker)
        else:
            self.marks.setdefault(tracker, []).append(offset)

    def finished(self, tracker: SlotTracker) -> bool:
        """Whether a slot's file may go: nothing outstanding, not being read, and no
        record of it still to be read again by the intake (`Wheel.read_again`)."""
        return (
            tracker.outstanding <= 0
            and not tracker.loading
            and tracker.partition not in self.unread
        )

    def delete(self, tracker: SlotTracker) -> None:
        tracker.deleted = True
        if tracker.on_file is not None:
            self.held -= tracker.on_file.memory
        self.marks.pop(tracker, None)
        self.matches_durable.extend(self.matches.pop(tracker, ()))
        self.trackers.pop((tracker.partition, tracker.second), None)
        self.cost.pop(tracker, None)
        self.store.delete(tracker.partition, tracker.second)

    def moved_away(self, records: Iterable[SlotRecord]) -> set[tuple[str, int]]:
        """(id, offset) of the records a reschedule has made stale: another copy is live."""
        return self.reschedules.superseded(
            (record.envelope.id, record.offset(), False) for record in records if record.envelope
        )

    def settled(self, tracker: SlotTracker, offset: int) -> None:
        """One record of a loaded slot is done: delete the file with the last one, and
        until then mark the record settled in it, so a restart does not send it again."""
        self.settle_many([(tracker, offset)])

    def settle_many(
        self, done: list[tuple[SlotTracker, int]], then: Callable[[], None] | None = None
    ) -> None:
        """`settled` for many records (those a commit point made durable), in one hold
        of the lock. The marks writer writes their marks at once, one write per slot,
        whatever the loader is busy with, and off the forwarder's path: a kill -9 a
        moment after the commit point does not send them again, and a slow disk holds
        up no forward. `then` runs once they are written (never if they could not
        be). With no marks writer running (not started, or stopped), they are written
        before this returns."""
        with self.lock:
            for tracker, offset in done:
                self.settle_locked(tracker, offset)
            if then is not None:
                self.after_marks.append(then)
        writer = self.marks_writer
        if writer is not None and writer.is_alive():
            self.marks_wanted.set()
        else:
            self.flush_marks()

    def flush_marks(self) -> None:
        """Append every settled mark gathered so far, one write per slot file, to the
        page cache (which outlives the process), outside the wheel's lock: a file
        deleted meanwhile is not made again (`SlotStore.append_to`). Then run what
        waited for them; the cancels those marks settle wait for a sync before they
        leave the cancel log (`Wheel.write_marks`). A write that fails raises (the
        store reports it; the daemon stops) and what waited for it never runs."""
        with self.flush_lock:
            writes: list[tuple[SlotTracker, int | None, list[int], list[str]]] = []
            with self.lock:
                marks, self.marks = self.marks, {}
                after, self.after_marks = self.after_marks, []
                for tracker, offsets in marks.items():
                    matches = self.matches.pop(tracker, [])
                    file_id = self.store.file_id(tracker.partition, tracker.second)
                    writes.append((tracker, file_id, offsets, matches))
            written: list[str] = []
            for tracker, file_id, offsets, matches in writes:
                if file_id is not None:
                    frames = b"".join(map(encode_settled, offsets))
                    self.store.append_to(tracker.partition, tracker.second, file_id, frames)
                written.extend(matches)
            if written:
                with self.lock:
                    self.matches_durable.extend(written)
            for callback in after:
                callback()
