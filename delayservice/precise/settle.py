"""Precise mode's settle protocol: what a commit point made durable leaves the wheel.

At each commit point the forwarder hands over the records it made durable (forwarded
or dead-lettered), and only those settle: a slot's record gets its settled mark (its
file is deleted with the last one), a dead letter of the intake lets its offset commit.
Apart from `precise_worker`, which wires it into both of a worker's forwarders: the
protocol is what the forwarders' tests and rigs settle through too, without a worker.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Protocol

from delayservice.forward.buffer import Runs
from delayservice.precise.delivery.delivery_log import DeliveryLog
from delayservice.precise.intake.offset_ledger import LevelLedger, PartitionLedger
from delayservice.precise.storage.slot_record import SlotRecord
from delayservice.precise.storage.storage_fault import StorageError
from delayservice.precise.wheel.slot_ledger import SlotTracker


class SettlesSlots(Protocol):
    def settle_many(
        self, done: list[tuple[SlotTracker, int]], then: Callable[[], None] | None = None
    ) -> None: ...


def settle_durable(runs: Runs, *, wheel: SettlesSlots, offsets: LevelLedger) -> None:
    """The settle protocol: `runs` are the records a commit point made durable. A slot's
    record is settled in its slot (a mark, or the file's deletion with the last one);
    a dead letter of the intake lets its offset commit. A slot file that cannot be
    marked or deleted stays on disk for the restart the fault is already causing."""
    with contextlib.suppress(StorageError):  # reported through `on_fault`
        wheel.settle_many(_slots_settling(runs, offsets))


def settle_unsent(records: list[SlotRecord], offsets: LevelLedger) -> None:
    """The intake's dead letters read again that a committed transaction delivered
    before this producer took over: not sent again, their offsets commit."""
    for record in records:
        _dead_letter_settles(record, offsets)


def _slots_settling(runs: Runs, offsets: LevelLedger) -> list[tuple[SlotTracker, int]]:
    """The slot records among `runs`; the intake's dead letters settle their offsets."""
    slots: list[tuple[SlotTracker, int]] = []
    for _, records in runs:
        for record in records:
            slot = record.slot
            if type(slot) is SlotTracker:
                slots.append((slot, record.offset()))
            else:
                _dead_letter_settles(record, offsets)
    return slots


def _dead_letter_settles(record: SlotRecord, offsets: LevelLedger) -> None:
    """A dead letter of the intake lets its offset commit."""
    if isinstance(record.slot, PartitionLedger):
        offsets.settle(record.slot, record.offset(), 0)


def settle_delivered(
    runs: Runs, *, wheel: SettlesSlots, offsets: LevelLedger, delivery: DeliveryLog
) -> None:
    """`settle_durable` after a transaction committed: once the marks are written (by
    the wheel's marks writer, off this thread), the delivery log need not carry them
    into the next transaction."""
    through = delivery.commits
    try:
        wheel.settle_many(
            _slots_settling(runs, offsets), functools.partial(delivery.marked, through)
        )
    except StorageError:  # reported through `on_fault`; the next transaction names them
        return
    delivery.note_position()
