"""Kafka's `SystemTimer`: a hierarchical timing wheel, a delay queue of buckets, an executor.

Time is integer milliseconds, as in Kafka. The clock is injectable as `ClockMs`; the
default is Kafka's `hiResClockMs` (monotonic nanoseconds // 1_000_000). A task added
at `now_ms` with `delay_ms` expires at `now_ms + delay_ms` and runs once the clock
reads at least that: never early on the millisecond grid, and late only by how long
the reaper takes to call `advance_clock` after the bucket is due.

The thread that calls `advance_clock` (Kafka's "ExpiredOperationReaper") blocks on the
bucket queue, advances the wheel to each due bucket and flushes it; expired tasks run
on the executor, never on that thread, so a slow task cannot hold back the clock.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import cast

from delayservice.timers.delay_queue import DelayQueue
from delayservice.timers.errors import TimerClosedError
from delayservice.timers.timing_wheel import (
    TimerTaskEntry,
    TimerTaskList,
    TimingWheel,
)

log = logging.getLogger(__name__)

ClockMs = Callable[[], int]
"""Integer milliseconds; only differences matter."""


def hi_res_clock_ms() -> int:
    """Kafka's `Time.SYSTEM.hiResClockMs()`: monotonic, millisecond resolution."""
    return time.monotonic_ns() // 1_000_000


class TimerTask(ABC):
    """Something to run once `delay_ms` has passed, and that can take itself back.

    Holds a back-pointer to its wheel entry so `cancel` is O(1), as Kafka's does.
    """

    def __init__(self, delay_ms: int) -> None:
        self.delay_ms = delay_ms
        self._timer: SystemTimer | None = None
        self._entry: TimerTaskEntry | None = None

    def cancel(self) -> bool:
        """Take the task off its timer; False when it already ran, was cancelled or never added."""
        timer = self._timer
        return timer is not None and timer.cancel(self)

    @abstractmethod
    def run(self) -> None:
        """The work; runs on the timer's executor."""


class SystemTimer:
    """Add tasks from any thread; one reaper thread calls `advance_clock` in a loop."""

    def __init__(
        self,
        executor_name: str = "system-timer",
        tick_ms: int = 1,
        wheel_size: int = 20,
        clock_ms: ClockMs = hi_res_clock_ms,
        executor: Executor | None = None,
    ) -> None:
        self._clock_ms = clock_ms
        # Kafka runs expired tasks on a one-thread pool named after the timer.
        self._executor = executor or ThreadPoolExecutor(1, thread_name_prefix=executor_name)
        self._delay_queue: DelayQueue[TimerTaskList] = DelayQueue(self._clock_seconds)
        self._wheel = TimingWheel(tick_ms, wheel_size, clock_ms(), self._delay_queue)
        self._lock = threading.Lock()
        self._size = 0
        self._closed = False

    def _clock_seconds(self) -> float:
        # The bucket queue compares expiration_ms / 1000 with this, on the same clock.
        return self._clock_ms() / 1000

    def add(self, task: TimerTask) -> None:
        """File `task` to run `task.delay_ms` from now; run it at once if that is already past."""
        entry = TimerTaskEntry(task, self._clock_ms() + task.delay_ms)
        with self._lock:
            if self._closed:
                raise TimerClosedError("the system timer")
            if task._entry is not None:  # re-added: Kafka moves the task to its new entry
                self._unlink(task)
            task._timer = self
            task._entry = entry
            filed = self._wheel.add(entry)
            if filed:
                self._size += 1
            else:
                task._entry = None
        if not filed:
            self._submit(task)

    def cancel(self, task: TimerTask) -> bool:
        with self._lock:
            return self._unlink(task)

    def advance_clock(self, timeout_ms: int) -> bool:
        """Wait up to `timeout_ms` for a due bucket, then advance through every due bucket.

        True when a bucket was processed (Kafka's contract). Tasks are handed to the
        executor after the lock is released, so a task that cancels or re-adds itself
        (or an inline executor) cannot deadlock the timer.
        """
        buckets = self._delay_queue.take_expired(timeout_ms / 1000)
        if not buckets:
            return False
        expired: list[TimerTask] = []
        with self._lock:
            for bucket in _due_buckets(buckets, self._delay_queue):
                self._wheel.advance_clock(bucket.expiration_ms)
                bucket.flush(lambda entry: self._reinsert(entry, expired))
        for task in expired:
            self._submit(task)
        return True

    def wakeup(self) -> None:
        """Make a reaper blocked in `advance_clock` return now."""
        self._delay_queue.wakeup()

    @property
    def size(self) -> int:
        """Tasks waiting in the wheel (Kafka's `taskCounter`)."""
        return self._size

    def shutdown(self, wait: bool = True) -> list[TimerTask]:
        """Refuse new tasks, let submitted ones finish, and return the ones that never ran.

        Kafka's `close()` drops them; returning them lets the caller account for them.
        """
        with self._lock:
            self._closed = True
            entries = [e for bucket in self._wheel.non_empty_buckets() for e in bucket.clear()]
            entries.sort(key=lambda entry: entry.expiration_ms)
            pending = [cast(TimerTask, entry.task) for entry in entries]
            for task in pending:
                task._entry = None
            self._size = 0
        self._delay_queue.close()
        self._executor.shutdown(wait=wait)
        return pending

    # -- internals -----------------------------------------------------------------
    def _reinsert(self, entry: TimerTaskEntry, expired: list[TimerTask]) -> None:
        # Lock held. Demotes to a finer wheel, or collects the task when it is due.
        if not self._wheel.add(entry):
            task = cast(TimerTask, entry.task)
            task._entry = None
            self._size -= 1
            expired.append(task)

    def _unlink(self, task: TimerTask) -> bool:
        # Lock held.
        entry = task._entry
        task._entry = None
        if entry is None or not entry.remove():
            return False
        self._size -= 1
        return True

    def _submit(self, task: TimerTask) -> None:
        try:
            self._executor.submit(_run_logged, task)
        except RuntimeError:
            # The executor is shut down: running the task here beats dropping it.
            log.warning("timer executor is shut down; running %r on the reaper thread", task)
            _run_logged(task)


def _run_logged(task: TimerTask) -> None:
    try:
        task.run()
    except Exception:
        log.exception("timer task %r failed", task)


def _due_buckets(
    first: list[TimerTaskList], queue: DelayQueue[TimerTaskList]
) -> Iterator[TimerTaskList]:
    """The buckets a blocking take returned, then every bucket that is due by now.

    Flushing demotes tasks into finer buckets that may already be due; Kafka's reaper
    therefore polls the queue until it comes back empty, and so does this.
    """
    yield from first
    while (bucket := queue.poll()) is not None:
        yield bucket
