"""Each record of an intake's batch, to its fate: framed for its slot file, handed to
`MarkerIntake`, or dead-lettered; the records to store are then written, one write
per file (`Wheel.append_many`).

What a record carries decides its fate, and nothing it carries stops the intake:
- a cancel marker (`delay-cancel`) calls off the message it names, unless the id names
  another partition (`markers.precise_ids`), where alone that message can be;
- a reschedule marker (`delay-reschedule`) moves the message it names to a new due
  time, at once if that time has passed (`Wheel.move_many`, after the batch's
  records are written, so a message and its reschedule may share a batch);
- a valid envelope is stored, due at append time + max(`delay-ms`, `delay-due-ms`);
- anything else is dead-lettered with a reason by the partition's owner (a replica
  leaves that to the owner): it joins the forwarder's buffer at once, and its offset
  commits once the forwarder's commit point made the dead letter durable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import cast

from confluent_kafka import Message

from delayservice.envelope import ByteHeaders, Envelope, Headers
from delayservice.forward import dead_letter as dl
from delayservice.kafka.record_headers import headers_of_run
from delayservice.precise.intake.admission import Admission
from delayservice.precise.intake.marker_intake import MarkerIntake
from delayservice.precise.intake.offset_ledger import PartitionLedger
from delayservice.precise.placement import Role
from delayservice.precise.storage.cancel_log import CancelLog
from delayservice.precise.storage.intake_offsets import IntakeOffsets
from delayservice.precise.storage.slot_file import encode_fields
from delayservice.precise.storage.slot_record import SlotRecord, stored_headers
from delayservice.precise.storage.storage_fault import StorageError
from delayservice.precise.wheel.wheel import Wheel

log = logging.getLogger(__name__)

_Fields = tuple[
    int, bytes | None, bytes | None, ByteHeaders, str, int, str, int | None, int, str | None
]
"""A stored record's (offset, key, value, user headers, target, delay ms, id,
`delay-due-ms`, due ms, `delay-partitioner`): its `SlotRecord` is built only if its slot
is in memory (most records go to disk only)."""


class RecordIntake:
    """The records of one intake's batches: what each carries, and the frames of those
    to store, held until the batch is written."""

    def __init__(
        self,
        topic: str,
        wheel: Wheel,
        cancels: CancelLog,
        admission: Admission,
        dead_letter: Callable[[SlotRecord], None],
        markers: MarkerIntake,
        roles: dict[int, Role],
        *,
        intake_offsets: IntakeOffsets,
        takeover_ms: int,
    ) -> None:
        """`dead_letter` hands a record to the forwarder to dead-letter; `roles` is the
        intake's (this member's role per partition)."""
        self._topic = topic
        self._wheel = wheel
        self._cancels = cancels
        self._admission = admission
        self._send_dead_letter = dead_letter
        self._markers = markers
        self._roles = roles
        self._offsets = intake_offsets
        self._takeover_ms = takeover_ms
        self._to_write: list[tuple[int, int, bytes, SlotRecord | _Fields]] = []
        """This batch's records: (partition, fire ms, frame, the record or its fields)."""

    def read_batch(
        self, ours: list[Message], ledgers: list[PartitionLedger], now_ms: int
    ) -> dict[PartitionLedger, list[int]]:
        """Decide each record of a batch (this intake's, with their ledgers); returns,
        per ledger, the offsets of dead letters on their way (not durable at the sync).

        The common record (`Admission.plain`) is framed in this loop itself: a call and
        a dozen attribute lookups per record were a tenth of the intake's time."""
        heads = headers_of_run(ours)  # one checked read each: see record_headers
        pending: dict[PartitionLedger, list[int]] = {}  # dead letters not yet durable
        plain, cancelled, to_write = self._admission.plain, self._cancels, self._to_write
        roles, takeover_ms = self._roles, self._takeover_ms
        for message, ledger, headers in zip(ours, ledgers, heads, strict=True):
            offset = message.offset() or 0
            try:
                found = plain(message, headers)
                key, value = message.key(), message.value()
                if found is not None and not isinstance(key, str) and not isinstance(value, str):
                    due, target, delay_ms, message_id, due_header, user, partitioner = found
                    if message_id in cancelled:
                        self._cancelled_first(ledger.partition, offset, message_id)
                        continue
                    partition = ledger.partition
                    replica = roles.get(partition) is Role.REPLICA
                    frame = encode_fields(
                        offset, due, replica, message_id, target, None, delay_ms, key, value,
                        stored_headers(user, partitioner),
                    )  # fmt: skip
                    fields = (
                        offset,
                        key,
                        value,
                        user,
                        target,
                        delay_ms,
                        message_id,
                        due_header,
                        due,
                        partitioner,
                    )
                    to_write.append(
                        (partition, due + takeover_ms if replica else due, frame, fields)
                    )
                elif not self._one(message, headers, ledger, offset, now_ms):
                    pending.setdefault(ledger, []).append(offset)
            except (StorageError, OSError):
                raise  # the disk's fault, not the record's: stop, dead-letter nothing
            except Exception as exc:
                log.exception(
                    "%s[%d]@%d: could not store a record", self._topic, ledger.partition, offset
                )
                if self._dead_letter(message, ledger, now_ms, f"{type(exc).__name__}: {exc}"):
                    pending.setdefault(ledger, []).append(offset)
        return pending

    def forget_batch(self) -> None:
        """The batch failed before it was settled: it is read again, and what it had not
        written yet is dropped."""
        self._to_write = []

    def write_batch(self, in_memory: list[tuple[SlotRecord, float]]) -> None:
        """Write the batch's records, one write per file (`Wheel.append_many`); those
        whose slot is in memory join `in_memory` (built here, only for them)."""
        batch, self._to_write = self._to_write, []
        if not batch:
            return
        trackers = self._wheel.append_many([(p, fire, frame) for p, fire, frame, _ in batch])
        for (partition, fire_ms, _, held), tracker in zip(batch, trackers, strict=True):
            if tracker is None:
                continue
            if isinstance(held, SlotRecord):
                held.slot = tracker
                record = held
            else:
                (offset, key, value, user, target, delay_ms, message_id, due_header, due,
                 partitioner) = held  # fmt: skip
                envelope = Envelope(
                    target, delay_ms, message_id, None, due_header, partitioner=partitioner
                )
                record = SlotRecord(
                    partition, offset, key, value, cast("Headers", user), envelope, due, tracker
                )
            in_memory.append((record, fire_ms / 1000))

    def _cancelled_first(self, partition: int, offset: int, message_id: str) -> bool:
        """A message whose cancel is in the log already; one read again below where this
        partition's writing had begun may sit in a slot file from that earlier reading
        (`MarkerIntake.cancelled_first`)."""
        maybe_stored = offset < self._offsets.written(partition)
        return self._markers.cancelled_first(
            partition, offset, message_id, maybe_stored=maybe_stored
        )

    def _one(
        self, message: Message, headers: object, ledger: PartitionLedger, offset: int, now_ms: int
    ) -> bool:
        """Handle one record that is not the common case (`read_batch` frames those): a
        marker, a dead letter, an envelope only the full parse reads. True when the
        coming sync makes it durable."""
        partition = ledger.partition
        replica = self._roles.get(partition) is Role.REPLICA
        if self._markers.read(headers if type(headers) is list else [], message, now_ms):
            return True
        record = self._admission.hold(message, ledger, now_ms, headers)
        held = record.envelope
        if record.problem is not None or held is None:
            if self._roles.get(partition) is Role.OWNER:
                self._send_dead_letter(record)  # settles the offset once durable
                return False
            return True  # the owner dead-letters it
        if held.id in self._cancels:
            return self._cancelled_first(partition, offset, held.id)
        frame = encode_fields(
            offset,
            record.due_ms,
            replica,
            held.id,
            held.target,
            held.partition,
            held.delay_ms,
            record.key(),
            record.value(),
            stored_headers(
                [(n, v.encode() if isinstance(v, str) else v) for n, v in record.user],
                held.partitioner,
            ),
        )
        fire_ms = record.due_ms + (self._takeover_ms if replica else 0)
        self._to_write.append((partition, fire_ms, frame, record))
        return True

    def _dead_letter(
        self, message: Message, ledger: PartitionLedger, now_ms: int, why: str
    ) -> bool:
        """A record whose handling raised goes to the dead-letter topic, owner only (a
        replica leaves it to the owner). True when a dead letter is on its way, to be
        settled once durable."""
        if self._roles.get(ledger.partition) is not Role.OWNER:
            return False
        record = self._admission.hold(message, ledger, now_ms)
        record.problem = (dl.REASON_INTERNAL, why)
        self._send_dead_letter(record)
        return True
