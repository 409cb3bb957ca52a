"""One memory cap for every level of the process.

A per-level cap multiplies by the number of levels and ignores what Python spends on
each record besides its payload, so twelve levels could outgrow the systemd unit's
`MemoryMax`. The budget counts each held record as its key, value and header bytes
plus `RECORD_OVERHEAD` (the client's message object and its queue slot, measured as
RSS by `benchmarks/memory_per_message.py`), and all levels draw on it. What it holds is
derived from the levels' buffers, which count records and bytes anyway, so the hot
path pays for no second counter and no second lock.
"""

from __future__ import annotations

from typing import Final, Protocol


class Holdings(Protocol):
    """What a level holds: its buffer's record and byte counts."""

    @property
    def total_buffered(self) -> int: ...

    @property
    def total_bytes(self) -> int: ...


RECORD_OVERHEAD: Final = 1024
LOW_WATER_RATIO: Final = 0.75


class MemoryBudget:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.low_water = int(max_bytes * LOW_WATER_RATIO)
        self._ledgers: list[Holdings] = []

    def register(self, ledger: Holdings) -> None:
        """Count what `ledger` holds against this budget (each level's, once)."""
        self._ledgers.append(ledger)

    @property
    def used(self) -> int:
        """Bytes plus per-record overhead over all levels; read without the levels'
        locks, which is exact enough for a gate (see `FlowControl.admits`)."""
        return sum(
            ledger.total_bytes + ledger.total_buffered * RECORD_OVERHEAD for ledger in self._ledgers
        )

    def below_low_water(self) -> bool:
        return self.used <= self.low_water
