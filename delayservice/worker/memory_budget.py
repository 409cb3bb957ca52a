"""One memory cap for every level of the process.

A per-level cap multiplies by the number of levels and ignores what Python spends on
each record besides its payload, so twelve levels could outgrow the systemd unit's
`MemoryMax`. The budget counts each held record as its key, value and header bytes
plus `RECORD_OVERHEAD` (the held record, ledger entry and buffer slot, measured as RSS
by `benchmarks/memory_per_message.py`), and all levels draw on it.
"""

from __future__ import annotations

import threading
from typing import Final

RECORD_OVERHEAD: Final = 1024
LOW_WATER_RATIO: Final = 0.75


class MemoryBudget:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.low_water = int(max_bytes * LOW_WATER_RATIO)
        self._used = 0
        self._lock = threading.Lock()

    @staticmethod
    def cost(size: int) -> int:
        return size + RECORD_OVERHEAD

    @property
    def used(self) -> int:
        return self._used

    def fits(self, size: int) -> bool:
        return self._used + size + RECORD_OVERHEAD <= self.max_bytes

    def add(self, cost: int) -> None:
        with self._lock:
            self._used += cost

    def below_low_water(self) -> bool:
        return self._used <= self.low_water
