"""The clock a part of the daemon is given rather than reading the time itself, so a
test or a simulation can drive time."""

from __future__ import annotations

from collections.abc import Callable

Clock = Callable[[], float]
"""Seconds as a float. `time.monotonic` by default; `time.time` when due times come from
a wall clock (a broker's append time)."""
