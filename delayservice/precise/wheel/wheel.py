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

Threads: the intake thread appends and moves (`reschedule_moves`), the loader thread
(here) reads slots in (`slot_loading`), retires cancels and expires them, the marks
writer (here) writes the settled marks a commit point gathered as soon as it has, the
splitter thread splits spans (`span_splitting`), the forwarder takes due records
(`slot_taking`); each part is given their shared state and its one lock,
`wheel_state`. No file is written on the forwarder's thread between two takes but a
slot's deletion.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Final

from delayservice.clock import Clock
from delayservice.precise.placement import Placement
from delayservice.precise.storage.cancel_log import CancelLog
from delayservice.precise.storage.reschedule_log import RescheduleLog
from delayservice.precise.storage.slot_record import SlotRecord
from delayservice.precise.storage.slot_store import SlotStore
from delayservice.precise.storage.storage_fault import StorageError
from delayservice.precise.wheel.held_bytes import HeldBytes
from delayservice.precise.wheel.read_through import ReadThrough
from delayservice.precise.wheel.reschedule_moves import READ_AGAIN, Reschedule, RescheduleMoves
from delayservice.precise.wheel.slot_buffer import SlotBuffer
from delayservice.precise.wheel.slot_ledger import SlotTracker
from delayservice.precise.wheel.slot_loading import MARKS_EVERY_S, SlotLoading
from delayservice.precise.wheel.slot_taking import SlotTaking
from delayservice.precise.wheel.span_splitting import SpanSplitting
from delayservice.precise.wheel.tiers import DEFAULT_HORIZON_S
from delayservice.precise.wheel.wheel_state import (
    UNBOUNDED,
    Coverage,
    Delivered,
    Outcomes,
    Takeover,
    WheelState,
)

__all__ = ["READ_AGAIN", "Reschedule", "Wheel"]  # move_many's request and outcome

log = logging.getLogger(__name__)

EXPIRE_EVERY_S: Final = 60.0


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
        held: HeldBytes | None = None,
        unread: Iterable[int] = (),
        topic: str = "",
        delivered: Delivered | None = None,
        takeover: Takeover | None = None,
        level_name: str = "exact",
        settle_unsent: Callable[[list[SlotRecord]], None] = lambda _records: None,
    ) -> None:
        """`max_buffered_bytes` bounds what loading slots brings into memory (records
        the intake hands straight in come on top), unless `held` is given: a cap shared
        with other wheels. `horizon_s` is how far ahead records are kept in slot files,
        and sets the tiers' widths. `unread`: partitions whose files may hold records of
        a batch the intake had not committed at the last stop; their slots load as
        usual but stay on disk, finished or not, until it has read that batch again
        (`read_again`). `topic`: the precise topic (the buffer's runs are
        keyed by its partitions). `delivered` (exactly-once): records it names were
        delivered by a transaction that committed, and are settled unsent (the intake's dead
        letters through `settle_unsent`, which lets their offsets commit). `takeover`
        (two copies, exactly-once): the replica's copies go out through their own
        forwarder, under the owner's transactional id (`takeover_buffer`). `level_name`
        ends its threads' names (`exact`, `exact-far`), as the forwarders' do: the near
        and far workers' log lines and thread dumps tell them apart."""
        cap = held if held is not None else HeldBytes(max_buffered_bytes)
        state = self._state = WheelState(
            store, reschedules, placement, clock, lookahead_s, horizon_s, cap, unread
        )
        self._cancels = cancels
        self._outcomes = outcomes
        self._loader = SlotLoading(state, cancels, outcomes, takeover_s)
        self._splitting = SpanSplitting(state, takeover_s)
        self._taking = SlotTaking(
            state, placement, outcomes, takeover_s, coverage, delivered, takeover, settle_unsent
        )
        self._moves = RescheduleMoves(state, cancels, takeover_s)
        state.buffer = SlotBuffer(clock, keep=self._taking.keep_or_stop, topic=topic)
        state.takeover_buffer = (
            SlotBuffer(clock, keep=self._taking.keep_copies_or_stop, topic=topic)
            if takeover is not None
            else None
        )
        self._loader_thread = threading.Thread(
            target=self._run, name=f"precise-loader-{level_name}", daemon=True
        )
        self._splitter_thread = threading.Thread(
            target=self._splitting.run_splits, name=f"precise-splitter-{level_name}", daemon=True
        )
        state.marks_writer = threading.Thread(
            target=self._run_marks, name=f"precise-marks-{level_name}", daemon=True
        )

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        self._loader_thread.start()
        self._splitter_thread.start()
        assert self._state.marks_writer is not None
        self._state.marks_writer.start()

    def stop(self, timeout: float) -> None:
        """The loader's last pass writes what the marks writer left."""
        state = self._state
        state.stopping.set()
        state.marks_wanted.set()
        state.wake.set()
        deadline = time.monotonic() + timeout
        assert state.marks_writer is not None
        if state.marks_writer.is_alive():
            state.marks_writer.join(timeout)
        self._loader_thread.join(max(0.1, deadline - time.monotonic()))
        if self._splitter_thread.is_alive():
            self._splitter_thread.join(max(0.1, deadline - time.monotonic()))

    def is_alive(self) -> bool:
        writer = self._state.marks_writer
        alive = writer is not None and writer.is_alive()
        return alive and self._loader_thread.is_alive() and self._splitter_thread.is_alive()

    def hold_until(self, gate: threading.Event) -> None:
        """Hand the forwarders nothing until `gate` is set, then `wake_takers`. After a
        start, the cancel or reschedule of a record due now may sit behind the records
        the intake reads first (`Intake.caught_up`); sent before, it would leak."""
        for buffer in self._buffers():
            buffer.hold_until(gate)

    def read_through(self, gate: ReadThrough) -> None:
        """Hand the forwarders only what fires within the intake's read-through limit
        (`read_through`): after a stall, a cancel acknowledged meanwhile may still be
        unread behind the records due."""
        for buffer in self._buffers():
            buffer.read_through(gate.limit_s)
            gate.on_move(buffer.limit_moved)

    def wake_takers(self) -> None:
        for buffer in self._buffers():
            buffer.wake()

    def _buffers(self) -> list[SlotBuffer]:
        return [b for b in (self.buffer, self.takeover_buffer) if b is not None]

    @property
    def buffer(self) -> SlotBuffer:
        """What the forwarder takes from; its taker drops what must not go out."""
        return self._state.buffer

    @property
    def takeover_buffer(self) -> SlotBuffer | None:
        """Two copies, exactly-once: the replica's copies, for the takeover forwarder."""
        return self._state.takeover_buffer

    @property
    def loaded_slots(self) -> int:
        return len(self._state.trackers)

    @property
    def disk_slots(self) -> int:
        """Files on disk, slots and spans."""
        return self._state.store.file_count()

    @property
    def held_bytes(self) -> int:
        """Estimated bytes of the records this wheel holds in memory."""
        return self._state.held

    # -- intake side ---------------------------------------------------------------
    def append(self, partition: int, fire_ms: int, frame: bytes) -> SlotTracker | None:
        """`append_many` for one record."""
        return self.append_many([(partition, fire_ms, frame)])[0]

    def append_many(self, records: list[tuple[int, int, bytes]]) -> list[SlotTracker | None]:
        """Write framed records, (partition, fire_ms, frame) each, into their files, one
        write per file (durable at the store's next sync). Per record, its slot's
        tracker when the slot is in memory: the caller then buffers the record itself
        once the write is durable. None: it stays on disk until its slot is loaded, or
        its slot holds it already (a record read again after a crash)."""
        with self._state.lock:
            return self._state.append_locked(records, once=True)

    def read_again(self, partition: int) -> None:
        """The intake has read again the batch `partition` had in flight at the last
        stop: its finished slots may go. Until then a slot loaded and sent stays in
        memory, so the copy read again finds it and is dropped (`FileOffsets`); had
        it gone, that copy would be sent once more from a new slot."""
        state = self._state
        with state.lock:
            state.unread.discard(partition)
            finished = [
                tracker
                for (held, _), tracker in state.trackers.items()
                if held == partition and state.finished(tracker)
            ]
            for tracker in finished:
                state.delete(tracker)

    def admit(self, records: list[tuple[SlotRecord, float]]) -> None:
        """Buffer records of in-memory slots, once their writes are durable; a record
        read again whose message was moved since is settled instead."""
        state = self._state
        with state.lock:
            stale = state.moved_away(record for record, _ in records)
            if stale:
                kept = []
                for item in records:
                    record = item[0]
                    if record.envelope and (record.envelope.id, record.offset()) in stale:
                        state.settle_locked(record.slot, record.offset())
                    else:
                        kept.append(item)
                records = kept
            for record, _ in records:
                if record.envelope is None:
                    continue
                message_id = record.envelope.id
                state.in_memory.add(message_id)
                if message_id in self._cancels:  # cancelled while its write became durable
                    state.cancelled_in_memory.add(message_id)
        state.schedule(records)

    def cancel(self, message_id: str, expires_ms: int) -> str:
        """Call off a message wherever it sits; returns what happened to the cancel.

        The cancel is written to the durable cancel log in every case but "too late",
        so a restart before the message's slot is deleted cannot bring it back.
        """
        state = self._state
        with state.lock:
            if message_id in state.recent:
                return "too_late"
            if not self._cancels.add(message_id, expires_ms):
                return "refused"
            if message_id in state.in_memory:
                state.cancelled_in_memory.add(message_id)
            return "pending"

    # -- settling ------------------------------------------------------------------
    def write_marks(self) -> None:
        """Append the settled marks gathered since the last call (those not written as
        they were settled: records called off as they loaded, stale copies), one write
        per slot; then retire the cancels whose messages those marks (or deletions)
        settled."""
        state = self._state
        state.flush_marks()
        with state.lock:
            retire, state.matches_durable = state.matches_durable, []
        if retire:
            self._retire(retire)

    def _retire(self, message_ids: list[str]) -> None:
        """Drop matched cancels from the log once the marks or deletions that settled
        their messages are durable. A failed sync keeps them: a kept cancel only waits
        for its expiry, a dropped one could let its message out after a restart."""
        state = self._state
        try:
            state.store.sync()
        except Exception:
            with state.lock:
                state.matches_durable.extend(message_ids)
            raise
        self.retire_cancels(message_ids)

    def retire_cancels(self, message_ids: list[str]) -> None:
        """Drop cancels whose messages are gone for good, remembering the ids for a
        while so that a reschedule after them is told the message was cancelled."""
        state = self._state
        with state.lock:
            state.called_off.add_all(message_ids)
        for message_id in message_ids:
            self._cancels.matched(message_id)

    def settled(self, tracker: SlotTracker, offset: int) -> None:
        self._state.settled(tracker, offset)

    def settle_many(
        self, done: list[tuple[SlotTracker, int]], then: Callable[[], None] | None = None
    ) -> None:
        self._state.settle_many(done, then)

    # -- reschedules and spans -----------------------------------------------------------
    def move_many(self, requests: list[Reschedule]) -> list[tuple[str, SlotRecord | None]]:
        return self._moves.move_many(requests)

    def split_due_spans(self) -> int:
        return self._splitting.split_due_spans()

    # -- the marks writer --------------------------------------------------------------
    def _run_marks(self) -> None:
        """Write the settled marks as soon as a commit point (or a take) gathers them."""
        state = self._state
        while True:
            state.marks_wanted.wait()
            state.marks_wanted.clear()
            if state.stopping.is_set() or not self._survived("marks writer", state.flush_marks):
                return  # stopping: the loader's last pass writes the rest

    def _survived(self, thread: str, step: Callable[[], None]) -> bool:
        """Run one step of a wheel thread's loop; False when the thread is to end (a
        storage fault, which the store reported: the daemon is stopping)."""
        try:
            step()
        except StorageError as fault:
            log.debug("precise %s stops on a storage fault: %s", thread, fault)
            return False
        except Exception:
            log.exception("precise %s: unexpected error; continuing", thread)
            self._state.stopping.wait(1.0)
        return True

    # -- the loader thread ------------------------------------------------------------
    def _run(self) -> None:
        state = self._state
        next_expiry = 0.0

        def step() -> None:
            nonlocal next_expiry
            wait = self._loader.load_due_slots()
            self.write_marks()
            if time.monotonic() >= next_expiry:
                next_expiry = time.monotonic() + EXPIRE_EVERY_S
                self._expire_cancels()
            state.wake.wait(min(wait, MARKS_EVERY_S) if wait is not None else MARKS_EVERY_S)
            state.wake.clear()

        while not state.stopping.is_set():
            if not self._survived("loader", step):
                return
        try:
            self.write_marks()
        except StorageError as fault:
            log.debug("precise loader: last settled marks not written: %s", fault)

    def _expire_cancels(self) -> None:
        state = self._state
        expired = self._cancels.expire(int(state.clock() * 1000))
        if expired:
            self._outcomes.cancelled("unmatched", len(expired))
        with state.lock:  # no copy is written while the files are looked at
            state.reschedules.expire(state.store.earliest())
