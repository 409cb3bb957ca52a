"""What the forwarder needs of the buffer it takes due records from.

Level mode's `PartitionGroup` (one FIFO per partition) and precise mode's `SlotBuffer`
(a heap of the records loaded from slot files) both provide it, so one forwarder, with
its commit points, serves both modes. Records are confluent `Message`s or anything
with the same accessors (`offset()`, `partition()`, `key()`, `value()`, `headers()`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Final, Protocol

NEVER: Final = float("inf")
TP = tuple[str, int]
"""A delay-topic partition, (topic, partition): a forwarder may serve several topics."""
Runs = list[tuple[TP, list[Any]]]
"""Records taken, as (topic partition, records) runs."""


class Buffer(Protocol):
    def take(self, limit: int) -> Runs:
        """Records due now, at most about `limit`; never one before its due time."""
        ...

    def put_back(
        self,
        tp: TP,
        records: list[Any],
        not_before_ms: int = 0,
        incarnation: int | None = None,
    ) -> None:
        """Taken records go back, to be taken again (not before `not_before_ms`), unless
        the partition was assigned anew since they were taken (`incarnation`)."""
        ...

    def incarnation(self, tp: TP) -> int | None:
        """Which assignment `tp`'s records belong to now (None: no such notion)."""
        ...

    def drop(self, tps: set[TP]) -> None: ...

    def wait(self, deadline: float) -> None:
        """Sleep until something is due, `deadline` (clock seconds) or `wake`."""
        ...

    def wake(self) -> None: ...

    def next_due_ms(self) -> int | None: ...

    def earliest_held_ms(self) -> int | None:
        """Due time of the earliest record held, taken and being sent included (what
        the overdue gauges and readiness read), or None."""
        ...

    def settle(self) -> None:
        """What was last taken has been sent or put back."""
        ...

    def retire(self, runs: Runs) -> None:
        """These records are committed and never go again."""
        ...

    def due_of(self, tp: TP, record: Any) -> int:
        """When `record`, taken from `tp`, was due (epoch ms)."""
        ...


class Alarm:
    """Where the forwarder sleeps: until the buffer's earliest record is due, a deadline,
    or a wake (a stop, a request, an earlier record: whoever changes the head notifies
    the buffer's condition)."""

    def __init__(self, cond: threading.Condition, clock: Callable[[], float]) -> None:
        self._cond = cond
        self._clock = clock
        self._woken = False

    def sleep(self, deadline: float, head: Callable[[], float]) -> None:
        """`head()`: when the earliest record is due (clock seconds, NEVER when none);
        read under the condition's lock."""
        with self._cond:
            while not self._woken:
                now = self._clock()
                until = min(head(), deadline)
                if until <= now:
                    break
                self._cond.wait(None if until == NEVER else until - now)
            self._woken = False

    def wake(self) -> None:
        with self._cond:
            self.wake_locked()

    def wake_locked(self) -> None:
        """`wake`, for a caller that holds the condition's lock."""
        self._woken = True
        self._cond.notify_all()
