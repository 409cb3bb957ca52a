"""Backpressure: decide when a partition must stop being read.

A record is admitted only while its partition holds fewer than `high_water` records
and the level's bytes stay under `max_bytes`, so the buffer never exceeds either bound;
a refused record is re-read later (the consumer seeks back to it). A paused partition
resumes once it has drained to `low_water` and the level is back under its byte
low-water mark. Because each partition's head is its earliest-due record, pausing
never holds a due record behind one that is not yet due.
"""

from __future__ import annotations

from delayservice.worker.ledger import LevelLedger, PartitionLedger

BYTES_LOW_WATER_RATIO = 0.75


class FlowControl:
    def __init__(self, high_water: int, low_water: int, max_bytes: int) -> None:
        if not 0 <= low_water < high_water:
            raise ValueError("need 0 <= low_water < high_water")
        self.high_water = high_water
        self.low_water = low_water
        self.max_bytes = max_bytes
        self.bytes_low_water = int(max_bytes * BYTES_LOW_WATER_RATIO)

    def admits(self, level: LevelLedger, partition: PartitionLedger, size: int) -> bool:
        if partition.buffered >= self.high_water:
            return False
        # An empty level always admits one record, however large, so nothing can wedge.
        return level.total_bytes == 0 or level.total_bytes + size <= self.max_bytes

    def may_resume(self, level: LevelLedger, partition: PartitionLedger) -> bool:
        return partition.buffered <= self.low_water and level.total_bytes <= self.bytes_low_water
