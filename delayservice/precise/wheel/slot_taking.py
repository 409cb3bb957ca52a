"""Taking due records for the forwarder: the last look before a record is sent.

What must not go out any more is held back here, under the wheel's lock: a record a
committed transaction delivered before this producer took over (exactly-once: a slot
record, or a dead letter of the intake read again, whose offset then commits), one
cancelled since it was loaded, a copy a reschedule has replaced, a replica's copy the
owner reported done (or, just after a start, one whose fate waits for the other
holder's reports). What goes out is remembered, so a cancel or reschedule that comes
later is told it is too late.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from delayservice.precise.placement import Placement, Role
from delayservice.precise.storage.slot_record import SlotRecord
from delayservice.precise.storage.storage_fault import StorageError
from delayservice.precise.wheel.slot_ledger import SlotTracker
from delayservice.precise.wheel.wheel_state import (
    Coverage,
    Delivered,
    Outcomes,
    Takeover,
    WheelState,
)

NOT_READY_RETRY_S: Final = 0.5
"""How soon a copy waiting for the other holder's reports to be read is looked at again."""


class SlotTaking:
    def __init__(
        self,
        state: WheelState,
        placement: Placement,
        outcomes: Outcomes,
        takeover_s: float,
        coverage: Coverage | None,
        delivered: Delivered | None,
        takeover_by: Takeover | None,
        settle_unsent: Callable[[list[SlotRecord]], None] = lambda _records: None,
    ) -> None:
        """`settle_unsent`: lets the intake commit the offsets of its dead letters that
        a committed transaction delivered before this producer took over."""
        self._state = state
        self._placement = placement
        self._outcomes = outcomes
        self._takeover_s = takeover_s
        self._coverage = coverage
        self._delivered = delivered
        self._takeover_by = takeover_by
        self._settle_unsent = settle_unsent

    def keep_or_stop(self, records: list[SlotRecord]) -> list[SlotRecord]:
        """`_keep`, on the forwarder's thread: a fault of the disk (reported through
        `on_fault`, the daemon is stopping) sends nothing; the records stay on disk."""
        try:
            return self._keep(records, self._delivered)
        except StorageError:
            return []

    def keep_copies_or_stop(self, records: list[SlotRecord]) -> list[SlotRecord]:
        """`_keep_copies`, as `keep_or_stop`."""
        try:
            return self._keep_copies(records)
        except StorageError:
            return []

    def _keep(
        self, records: list[SlotRecord], delivered: Delivered | None, *, final: bool = True
    ) -> list[SlotRecord]:
        """Runs on the taking thread, just before the records are sent. Not `final`:
        a first look, and the records kept are not yet counted as sent."""
        if not (records := self._without_dead_letters_sent_before(records, delivered)):
            return records
        out: list[SlotRecord] = []
        settled: list[tuple[SlotTracker, int]] = []
        deferred: list[tuple[SlotRecord, float]] = []
        cancelled = 0
        now_ms = self._state.clock() * 1000
        replicas: dict[int, bool] = {}  # partition -> this member holds its replica
        sent: list[str] = []
        # An owner's record due before this may have been taken over meanwhile.
        overdue_before_ms, coverage = now_ms - self._takeover_s * 1000, self._coverage
        with self._state.lock:
            in_memory, cancelled_in_memory = self._state.in_memory, self._state.cancelled_in_memory
            stale = self._state.moved_away(records)
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
                if delivered is not None and self._sent_before(record, delivered, settled, sent):
                    continue
                if message_id in cancelled_in_memory:
                    self._cancelled_now(message_id, tracker, record.offset())
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
                    if self._covered(coverage, record, tracker, settled):
                        continue
                out.append(record)
                if not final:
                    in_memory.add(message_id)  # looked at again before it goes
                    continue
                if replica:
                    self._outcomes.took_over()
                sent.append(message_id)
            self._state.recent.add_all(sent)
        self._kept(cancelled, settled, deferred)
        return out

    def _without_dead_letters_sent_before(
        self, records: list[SlotRecord], delivered: Delivered | None
    ) -> list[SlotRecord]:
        """`records` less the intake's dead letters a committed transaction delivered
        before this producer took over (read again after a kill, before the intake
        committed their offsets): not sent again, their offsets commit."""
        if delivered is None:
            return records
        unsent = {
            id(record)
            for record in records
            if not isinstance(record.slot, SlotTracker)
            and delivered.sent(record.partition(), record.offset())
        }
        if not unsent:
            return records
        self._settle_unsent([record for record in records if id(record) in unsent])
        return [record for record in records if id(record) not in unsent]

    def _covered(
        self,
        coverage: Coverage,
        record: SlotRecord,
        tracker: SlotTracker,
        settled: list[tuple[SlotTracker, int]],
    ) -> bool:
        """Whether the other holder settled `record` (it is settled here unsent)."""
        if not coverage.covers(record.partition(), record.offset(), record.due_ms):
            return False
        self._outcomes.cleaned()
        settled.append((tracker, record.offset()))
        return True

    def _keep_copies(self, records: list[SlotRecord]) -> list[SlotRecord]:
        """`_keep` for the takeover forwarder (two copies, exactly-once). A first look,
        and another once the owner's latest word is read, drop what the owner is known
        to have delivered without touching its transactional id; only copies left then
        init the producer under the owner's id,
        which fences the owner and ends its open transaction, and after learning what
        committed before (`Takeover.ready`) the final look decides: the owner may have
        committed more in between."""
        takeover = self._takeover_by
        assert takeover is not None
        first = self._keep(records, takeover.delivered, final=False)
        if not first:
            return first
        takeover.catch_up()  # the owner's latest word first: it may cover them
        first = self._keep(first, takeover.delivered, final=False)
        if not first:
            return first
        try:
            wait = takeover.ready()
        except:  # a bare KafkaError too (kafka.client_errors)
            self._hold_copies(first, NOT_READY_RETRY_S)
            raise
        if wait > 0:
            self._hold_copies(first, wait)
            return []
        return self._keep(first, takeover.delivered)

    def _hold_copies(self, records: list[SlotRecord], wait_s: float) -> None:
        """Copies looked at and not sent: back into the takeover buffer, for `wait_s`."""
        state = self._state
        with state.lock:
            for record in records:
                if record.envelope is not None:
                    state.in_memory.add(record.envelope.id)
        buffer = state.takeover_buffer
        assert buffer is not None
        fire = state.clock() + wait_s
        buffer.schedule_many([(record, fire) for record in records])

    def _cancelled_now(self, message_id: str, tracker: SlotTracker, offset: int) -> None:
        """A record cancelled since it was loaded is settled unsent (lock held). Match and
        mark under one hold of the lock, so no write of marks in between can retire the
        cancel before its message's mark."""
        state = self._state
        state.cancelled_in_memory.discard(message_id)
        state.matches.setdefault(tracker, []).append(message_id)
        state.settle_locked(tracker, offset)

    def _sent_before(
        self,
        record: SlotRecord,
        delivered: Delivered,
        settled: list[tuple[SlotTracker, int]],
        sent: list[str],
    ) -> bool:
        """Whether a committed transaction delivered `record` and its settled mark was
        not written (a kill, or an unknown outcome, right after the commit): it is
        settled now, and counts as sent for markers that come later (lock held)."""
        if not delivered.sent(record.partition(), record.offset()):
            return False
        assert record.envelope is not None
        self._state.cancelled_in_memory.discard(record.envelope.id)
        settled.append((record.slot, record.offset()))
        sent.append(record.envelope.id)
        return True

    def _kept(
        self,
        cancelled: int,
        settled: list[tuple[SlotTracker, int]],
        deferred: list[tuple[SlotRecord, float]],
    ) -> None:
        """What `_keep` held back: count the cancelled, settle the covered and hold the
        deferred again (outside the lock)."""
        state = self._state
        if cancelled:
            self._outcomes.cancelled("cancelled", cancelled)
        state.settle_many(settled)
        if deferred:
            state.schedule(deferred)
