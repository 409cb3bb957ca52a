"""Backpressure: decide when a partition must stop being read.

A record is admitted only while its partition holds fewer than `high_water` records
and the process-wide memory budget has room for it, so the buffer never exceeds either
bound; a refused record is re-read later (the consumer seeks back to it). A partition
is paused a quarter before its mark (`pause_at`), so a refusal, and its seek, is rare. A paused
partition resumes once it has drained to `low_water` and the budget is back under its
low-water mark. Because each partition's head is its earliest-due record, pausing
never holds a due record behind one that is not yet due.
"""

from __future__ import annotations

from collections.abc import Sequence, Sized
from typing import Final

from delayservice.level.memory_budget import RECORD_OVERHEAD, MemoryBudget

RECHECK_EVERY: Final = 64
"""Records admitted against a local estimate of the budget's room before it is summed
again. The shared worker is the budget's only user; with one worker per level, the
other workers' admissions between two sums can pass the cap by at most this many
records each."""


class FlowControl:
    """One per level worker, used by its consumer thread only."""

    def __init__(self, high_water: int, low_water: int, budget: MemoryBudget) -> None:
        if not 0 <= low_water < high_water:
            raise ValueError("need 0 <= low_water < high_water")
        self.high_water = high_water
        self.low_water = low_water
        self.pause_at = max(low_water + 1, high_water - high_water // 4)
        """A partition is paused from here on, before a record must be refused: what
        its client delivers meanwhile is still admitted up to `high_water`."""
        self.budget = budget
        self._room = 0  # this worker's estimate of the budget's free bytes
        self._until_recheck = 0

    def admits(
        self, partition_buffered: int, level_buffered: int, size: int, unaccounted: int = 0
    ) -> bool:
        """Whether one more record of `size` bytes fits, its partition holding
        `partition_buffered` and its level `level_buffered` records already, of which
        `unaccounted` bytes (admitted from the same batch) are not in the buffer yet."""
        if partition_buffered >= self.high_water:
            return False
        # A level holding nothing always admits one record, however large, so no level
        # can wedge behind the others: the cap may be passed by one record per level.
        if level_buffered == 0:
            return True
        cost = size + RECORD_OVERHEAD
        self._room -= cost
        self._until_recheck -= 1
        if self._room >= 0 and self._until_recheck > 0:
            return True
        # Summing every level's holdings per record cost a sixth of the consumer thread.
        self._room = self.budget.max_bytes - self.budget.used - unaccounted - cost
        self._until_recheck = RECHECK_EVERY
        return self._room >= 0

    def admit_many(
        self, partition_buffered: int, level_buffered: int, records: Sequence[Sized], allowance: int
    ) -> int:
        """How many of `records` (in order; each costs its `len` plus `allowance` bytes)
        are admitted. One sum of the budget per batch while it has room; record by
        record (`admits`) once it is tight."""
        fits = max(0, min(len(records), self.high_water - partition_buffered))
        if fits == 0:
            return 0
        cost = sum(map(len, records[:fits])) + fits * (allowance + RECORD_OVERHEAD)
        if self.budget.used + cost <= self.budget.max_bytes:
            self._room = 0  # the next `admits` sums again
            return fits
        taken = pending = 0
        self._room = 0  # tight: the first record sums the budget again
        for record in records[:fits]:
            size = len(record) + allowance
            if not self.admits(partition_buffered + taken, level_buffered + taken, size, pending):
                break
            taken += 1
            pending += size + RECORD_OVERHEAD
        return taken

    def may_resume(self, partition_buffered: int) -> bool:
        return partition_buffered <= self.low_water and self.budget.below_low_water()
