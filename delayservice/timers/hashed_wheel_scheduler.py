"""`HashedWheelTimer` behind the `Scheduler` protocol.

The timer's worker fires a slot by moving it into an output `DelayQueue`, which the
taker reads; the queue's own due check is the never-early guard. The worker ticks
every `tick_duration` whether or not anything is due (Netty's design), so this adapter
suits comparisons and tests more than long-running use, where the hierarchical wheel
sleeps until its next bucket instead.

Precision: as the timer's, at most one tick late, never early. `next_due` and
`remove_where` scan every pending slot: O(n).
"""

from __future__ import annotations

import itertools
import operator
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from delayservice.clock import Clock
from delayservice.timers.base import DEFAULT_CLOCK, TimerHandle
from delayservice.timers.delay_queue import DelayEntry, DelayQueue
from delayservice.timers.errors import TimerClosedError
from delayservice.timers.hashed_wheel import HashedWheelTimeout, HashedWheelTimer

T = TypeVar("T")

_due_order = operator.attrgetter("due", "seq")


class WheelSlot(Generic[T]):
    """The handle `schedule` returns; follows the item from the wheel to the output queue."""

    __slots__ = ("cancelled", "due", "item", "output", "seq", "timeout")

    def __init__(self, item: T, due: float, seq: int) -> None:
        self.item = item
        self.due = due
        self.seq = seq
        self.cancelled = False
        self.timeout: HashedWheelTimeout | None = None
        self.output: DelayEntry[WheelSlot[T]] | None = None


class HashedWheelScheduler(Generic[T]):
    def __init__(
        self,
        clock: Clock = DEFAULT_CLOCK,
        tick_duration: float = 0.005,
        ticks_per_wheel: int = 512,
        max_pending_timeouts: int = 0,
    ) -> None:
        self._clock = clock
        self._timer = HashedWheelTimer(
            tick_duration,
            ticks_per_wheel,
            clock=clock,
            max_pending_timeouts=max_pending_timeouts,
            name="hashed-wheel-scheduler",
        )
        self._output: DelayQueue[WheelSlot[T]] = DelayQueue(clock)
        self._live: dict[int, WheelSlot[T]] = {}
        # Orders a slot's move from _live to _output against cancel and remove_where.
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._closed = False

    def schedule(self, item: T, due: float) -> WheelSlot[T]:
        slot = WheelSlot(item, due, next(self._seq))
        with self._lock:
            if self._closed:
                raise TimerClosedError("the hashed wheel scheduler")
            slot.timeout = self._timer.new_timeout_at(lambda _t: self._fire(slot), due)
            self._live[slot.seq] = slot
        return slot

    def schedule_many(self, items: list[tuple[T, float]]) -> None:
        for item, due in items:
            self.schedule(item, due)

    def cancel(self, handle: TimerHandle) -> bool:
        if not isinstance(handle, WheelSlot):
            return False
        with self._lock:
            if handle.cancelled:
                return False
            if self._live.pop(handle.seq, None) is not None:
                assert handle.timeout is not None
                handle.timeout.cancel()
            elif handle.output is None or not self._output.cancel(handle.output):
                return False  # already taken
            handle.cancelled = True
            return True

    def take_expired(self, timeout: float | None = None) -> list[T]:
        # Equal dues leave the wheel in scheduling order, so the output queue's
        # (due, arrival) order is (due, scheduling order).
        return [slot.item for slot in self._output.take_expired(timeout)]

    def wait_due(self, timeout: float | None = None) -> None:
        self._output.wait_due(timeout)

    def wakeup(self) -> None:
        self._output.wakeup()

    def remove_where(self, predicate: Callable[[T], bool]) -> list[T]:
        with self._lock:
            removed = [slot for slot in self._live.values() if predicate(slot.item)]
            for slot in removed:
                del self._live[slot.seq]
                assert slot.timeout is not None
                slot.timeout.cancel()
                slot.cancelled = True
            removed.extend(self._output.remove_where(lambda slot: predicate(slot.item)))
        removed.sort(key=_due_order)
        return [slot.item for slot in removed]

    def next_due(self) -> float | None:
        with self._lock:
            dues = [slot.due for slot in self._live.values()]
            head = self._output.next_due()
        if head is not None:
            dues.append(head)
        return min(dues, default=None)

    def __len__(self) -> int:
        return len(self._live) + len(self._output)

    def close(self) -> list[T]:
        with self._lock:
            self._closed = True
        # Outside the lock: the worker may be waiting for it inside _fire.
        self._timer.stop()
        with self._lock:
            rest = list(self._live.values())
            self._live.clear()
            rest.extend(self._output.close())
        rest.sort(key=_due_order)
        return [slot.item for slot in rest]

    def _fire(self, slot: WheelSlot[T]) -> None:
        # Worker thread.
        with self._lock:
            if self._live.pop(slot.seq, None) is not None:
                slot.output = self._output.schedule(slot, slot.due)
