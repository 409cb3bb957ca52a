"""The shape every timer in this package shares.

A scheduler holds items until their due time on an injectable clock. Producers call
`schedule`; one consumer calls `take_expired`, which blocks until the earliest item is
due (or until `wakeup`), then returns every item due by then in due order, ties in
scheduling order. These are the source material's timer designs, kept as a library
with their benchmark (`benchmarks/timers.py`); the daemon's buffers do not use them:
a level partition is already in due order, so a heap of partition heads suffices.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from delayservice.clock import Clock

T = TypeVar("T")

DEFAULT_CLOCK: Clock = time.monotonic


class TimerHandle(Protocol):
    """What `schedule` returns; pass it to `cancel`."""

    @property
    def due(self) -> float: ...

    @property
    def cancelled(self) -> bool: ...


class Scheduler(Protocol[T]):
    def schedule(self, item: T, due: float) -> TimerHandle:
        """Hold `item` until `due` (clock seconds). Wakes a blocked taker if it is the new head."""
        ...

    def schedule_many(self, items: list[tuple[T, float]]) -> None:
        """Schedule (item, due) pairs under one lock: one acquisition per batch, not per item."""
        ...

    def cancel(self, handle: TimerHandle) -> bool:
        """Stop a scheduled item from firing. False if it already fired or was cancelled."""
        ...

    def take_expired(self, timeout: float | None = None) -> list[T]:
        """Block until an item is due, `timeout` passes or `wakeup` is called.

        Returns every item due now, earliest first; an empty list on timeout or wakeup.
        Never returns an item before its due time.
        """
        ...

    def wait_due(self, timeout: float | None = None) -> None:
        """Block like `take_expired` but take nothing: return once the earliest item is
        due, `timeout` passes or `wakeup` is called. Lets the caller take under its own
        lock, so two threads can share the taking without reordering what they send."""
        ...

    def wakeup(self) -> None:
        """Make a blocked `take_expired` return now (used at shutdown)."""
        ...

    def remove_where(self, predicate: Callable[[T], bool]) -> list[T]:
        """Remove and return every pending item matching `predicate` (rebalance revokes)."""
        ...

    def next_due(self) -> float | None:
        """Due time of the earliest pending item, if any."""
        ...

    def __len__(self) -> int:
        """Pending items, cancelled ones excluded."""
        ...

    def close(self) -> list[T]:
        """Stop; return the items that never fired so the caller can account for them."""
        ...
