"""Pick the per-level buffer by the `scheduler` setting."""

from __future__ import annotations

from typing import Literal, TypeVar

from delayservice.timers.base import Clock, Scheduler
from delayservice.timers.delay_queue import DelayQueue

T = TypeVar("T")


def make_scheduler(kind: Literal["heap", "wheel"], clock: Clock) -> Scheduler[T]:
    if kind == "heap":
        return DelayQueue(clock)
    raise NotImplementedError(f"scheduler {kind!r} is not available yet")
