"""The in-memory side of a loaded slot file: how many of its records are still to settle,
and which offsets its file held when it was loaded.

A record forwarded from the wheel had its offset committed long before, when its slot
write became durable, so settling it (once the forwarder's commit point made its
forward durable) means one fewer outstanding record in its slot, and the slot's file
is deleted when none is left.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left


class FileOffsets:
    """The offsets a slot's file held when its loading began, so a record read again by
    the intake (its batch not committed before a crash) is held once, not once from the
    file and once more as the intake hands it in. A slot's file holds each offset once
    as far as the wheel is concerned: the index takes the first copy of an offset
    (`SlotIndex.take`), and this drops a copy appended while the slot is in memory.

    While the file is being indexed its offsets are not known yet: a record appended
    then is held, and its offset noted so that the index drops the file's copy."""

    __slots__ = ("_early", "_sorted")

    def __init__(self) -> None:
        self._sorted: array[int] | None = None
        self._early: list[int] = []

    def first_copy(self, offset: int) -> bool:
        """Whether a record with `offset`, appended now, is the slot's only copy to hold.
        While the file is being indexed, yes (and `indexed` will say so)."""
        found = self._sorted
        if found is None:
            self._early.append(offset)
            return True
        index = bisect_left(found, offset)
        return index == len(found) or found[index] != offset

    def indexed(self, offsets: array[int]) -> list[int]:
        """The file's offsets (sorted) are known now: returns the offsets held meanwhile,
        whose copies in the file are not to be taken."""
        self._sorted = offsets
        early, self._early = self._early, []
        return early

    @property
    def memory(self) -> int:
        """Bytes the offsets take."""
        return 0 if self._sorted is None else self._sorted.itemsize * len(self._sorted)


class SlotTracker:
    """Records loaded from (or appended into) one slot file point back to it."""

    __slots__ = ("deleted", "loading", "on_file", "outstanding", "partition", "second")

    def __init__(self, partition: int, second: int, on_file: FileOffsets | None = None) -> None:
        self.partition = partition
        self.second = second
        self.outstanding = 0
        """Records of the slot not yet forwarded, dead-lettered, cancelled or cleaned."""
        self.deleted = False
        self.loading = False
        """Its file is being read: not to be deleted, even when nothing is outstanding."""
        self.on_file = on_file
        """For a slot loaded from a file that was there before: the offsets it held. None
        for a slot in memory from its first record (every record of it came in
        through the intake of this process)."""
