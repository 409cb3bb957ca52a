"""The bytes precise mode holds in memory, against one cap for the whole process.

The precise topic and the far topic each have a wheel, and a burst may fall due in
either: one cap across both (`max_buffered_bytes`) keeps the bound a user configured
a bound on the process, not per wheel. Each wheel counts its own bytes in a plain
integer, as it always did (a lock per settled record held the wheel's lock longer and
halved a burst's drain); the cap adds them up only when a wheel asks for room, once
per slice of records it loads.
"""

from __future__ import annotations

from collections.abc import Callable


class HeldBytes:
    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._holders: list[Callable[[], int]] = []

    def add_holder(self, held: Callable[[], int]) -> None:
        """A wheel's count of the bytes it holds, read without a lock (an int read is
        atomic; a count a moment old only shifts a load by a slice)."""
        self._holders.append(held)

    @property
    def total(self) -> int:
        return sum(held() for held in self._holders)

    def room(self) -> int:
        """Bytes that may still be brought into memory (negative: over the cap)."""
        return self.cap - self.total
