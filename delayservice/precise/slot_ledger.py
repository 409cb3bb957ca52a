"""Settling records in precise mode, through the forwarder shared with level mode.

The forwarder settles every record it finishes through its ledger. A record forwarded
from the wheel had its offset committed long before, when its slot write became
durable, so settling it means one fewer outstanding record in its slot, and the slot's
file is deleted when none is left. Records the intake hands straight to the forwarder
(dead letters) still settle through their partition's ledger, so their offsets commit
only once the dead letter is acknowledged.
"""

from __future__ import annotations

from collections.abc import Callable

from delayservice.worker.ledger import LevelLedger, PartitionLedger


class SlotTracker(PartitionLedger):
    """The in-memory side of one loaded slot file; held records point back to it."""

    __slots__ = ("deleted", "loading", "outstanding", "second")

    def __init__(self, partition: int, second: int) -> None:
        super().__init__(partition)
        self.second = second
        self.outstanding = 0
        """Records of the slot not yet forwarded, dead-lettered, cancelled or cleaned."""
        self.deleted = False
        self.loading = False
        """Its file is being read: not to be deleted, even when nothing is outstanding."""


class PreciseLedger(LevelLedger):
    def __init__(self, on_slot_settled: Callable[[SlotTracker, int], None]) -> None:
        super().__init__(budget=None)
        self._on_slot_settled = on_slot_settled

    def settle(
        self, ledger: PartitionLedger, offset: int, size: int, *, forwarded: bool = False
    ) -> None:
        if isinstance(ledger, SlotTracker):
            with self.lock:
                self.forwarded += forwarded
            self._on_slot_settled(ledger, offset)
            return
        super().settle(ledger, offset, size, forwarded=forwarded)
