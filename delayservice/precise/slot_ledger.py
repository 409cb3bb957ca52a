"""The in-memory side of a loaded slot file: how many of its records are still to settle.

A record forwarded from the wheel had its offset committed long before, when its slot
write became durable, so settling it (once the forwarder's commit point made its
forward durable) means one fewer outstanding record in its slot, and the slot's file
is deleted when none is left.
"""

from __future__ import annotations


class SlotTracker:
    """Records loaded from (or appended into) one slot file point back to it."""

    __slots__ = ("deleted", "loading", "outstanding", "partition", "second")

    def __init__(self, partition: int, second: int) -> None:
        self.partition = partition
        self.second = second
        self.outstanding = 0
        """Records of the slot not yet forwarded, dead-lettered, cancelled or cleaned."""
        self.deleted = False
        self.loading = False
        """Its file is being read: not to be deleted, even when nothing is outstanding."""
