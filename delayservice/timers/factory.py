"""Pick a timer design by name, for the benchmark and the tests.

"heap" is the JDK-style `DelayQueue`: the C `heapq` makes it the cheapest to insert
into, and the default. "wheel" is Kafka's hierarchical timing wheel (1 ms ticks, 512
buckets per level): O(1) cancel, and expiry cost per item that stays flat as the
buffer grows, where the heap's pop slows with its depth. Both honour the same
contract: items come out in (due, scheduling order), never before `clock() >= due`.
"""

from __future__ import annotations

from typing import Literal, TypeVar, cast

from delayservice.clock import Clock
from delayservice.timers.base import Scheduler
from delayservice.timers.delay_queue import DelayQueue
from delayservice.timers.wheel_scheduler import WheelScheduler

T = TypeVar("T")

WHEEL_TICK_MS = 1
WHEEL_SIZE = 512


def make_scheduler(kind: Literal["heap", "wheel"], clock: Clock) -> Scheduler[T]:
    if kind == "heap":
        # DelayQueue's schedule/cancel name its own handle type where the protocol names
        # TimerHandle; structurally it is one, so the cast only widens the signature.
        return cast(Scheduler[T], DelayQueue(clock))
    if kind == "wheel":
        return WheelScheduler(clock, tick_ms=WHEEL_TICK_MS, wheel_size=WHEEL_SIZE)
    raise ValueError(f"unknown scheduler kind {kind!r}; expected 'heap' or 'wheel'")
