"""This host's clock, held back to the broker's, so that no due time is met early.

A level record is due at its broker-written append time plus the level's delay, and the
forwarder compares that with this host's clock: a host clock ahead of the broker's by
d seconds would forward every record d seconds early. Every record read bounds d from
above: (local time when read) - (append time) = d + how long it took to read, and a
read never takes negative time. So the smallest such difference among recent records
(`observe`) is an upper bound on d, and a clock held back by it (`time`) is never ahead
of the broker's. It costs at most the smallest read delay seen, milliseconds while
records flow; when only old records were read (a quiet level's backlog after a
restart), the bound is loose and the hold-back is `MAX_HOLD_BACK_S`, until a fresh
record tightens it.

A host clock ahead by more than `MAX_HOLD_BACK_S` can still make records early, by the
excess: `delayservice_clock_offset_seconds` shows the bound, and operations.md says to
alert on it. A host behind the broker is never corrected for (records are late by that
much, never early). Recent means the last `WINDOW_S` to `2 * WINDOW_S` seconds, so a
clock stepped forward is followed within that long.
"""

from __future__ import annotations

import threading
import time as _time
from typing import Any, Final

MAX_HOLD_BACK_S: Final = 5.0
WINDOW_S: Final = 10.0


class BrokerClock:
    """`time()` and `monotonic()` like the `time` module, with `time()` held back by the
    bound on how far this host runs ahead of the broker. One per process: the skew is
    the host's, and a fresh record of any level tightens it for all."""

    def __init__(self, clock: Any = _time, max_hold_back_s: float = MAX_HOLD_BACK_S) -> None:
        self._clock = clock
        self._max_ms = int(max_hold_back_s * 1000)
        self._lock = threading.Lock()
        self._window_start = clock.monotonic()
        self._current: int | None = None  # smallest read delay (ms) in this window
        self._previous: int | None = None  # and in the one before
        self.hold_back_s = 0.0
        """What `time()` is held back by now (seconds, 0 to `max_hold_back_s`)."""
        self.bound_s: float | None = None
        """The bound itself, uncapped (the gauge): None until a record was read."""

    def time(self) -> float:
        return float(self._clock.time()) - self.hold_back_s

    def monotonic(self) -> float:
        return float(self._clock.monotonic())

    def observe(self, read_ms: int, append_ms: int) -> None:
        """A record appended at `append_ms` (broker clock) was read at `read_ms` (this
        host's clock, after the read returned)."""
        delay = read_ms - append_ms
        with self._lock:
            now = self._clock.monotonic()
            if now - self._window_start >= WINDOW_S:
                self._previous = self._current
                self._current = None
                self._window_start = now
            if self._current is None or delay < self._current:
                self._current = delay
            known = [d for d in (self._current, self._previous) if d is not None]
            bound = min(known)
            self.bound_s = bound / 1000
            self.hold_back_s = min(max(bound, 0), self._max_ms) / 1000
