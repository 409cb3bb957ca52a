"""The bytes precise mode holds in memory, against one cap for the whole process.

The precise topic and the far topic each have a wheel, and a burst may fall due in
either: one cap across both (`max_buffered_bytes`) keeps the bound a user configured
a bound on the process, not per wheel.
"""

from __future__ import annotations

import threading


class HeldBytes:
    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._total = 0
        self._lock = threading.Lock()  # the wheels change it from their own threads

    def add(self, delta: int) -> None:
        with self._lock:
            self._total += delta

    @property
    def total(self) -> int:
        return self._total

    def room(self) -> int:
        """Bytes that may still be brought into memory (negative: over the cap)."""
        return self.cap - self._total
