"""Netty's `HashedWheelTimer`: one wheel of `ticks_per_wheel` buckets, turned by one worker.

Adding and cancelling never touch the wheel: they append to a pending queue and a
cancellation queue (`deque.append` and `popleft` are atomic in CPython, standing in for
Netty's MPSC queues) that the worker drains at the start of every tick. Only the worker
touches buckets, so they need no lock. A timeout more than one wheel turn away waits in
its bucket with `remaining_rounds`, decremented each time the hand passes.

Precision: a timeout fires on the first tick boundary at or after its deadline, so it
is never early and at most one `tick_duration` late, plus the worker's wake-up latency,
as long as tasks are short and fewer than `MAX_TRANSFER_PER_TICK` timeouts arrive per
tick. The price is Netty's known weakness: the worker wakes every tick even when the
wheel is empty. Time is float seconds on the injected clock, counted from the moment
the worker starts.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor

from delayservice.clock import Clock
from delayservice.timers.base import DEFAULT_CLOCK
from delayservice.timers.errors import TimerClosedError, TimerRejectedError, TimerStateError

log = logging.getLogger(__name__)

MAX_TRANSFER_PER_TICK = 100_000
"""Netty moves at most this many new timeouts into the wheel per tick, so a flood of
adds cannot stall the hand; the rest wait for the next tick."""

ST_INIT, ST_CANCELLED, ST_EXPIRED = 0, 1, 2
WORKER_INIT, WORKER_STARTED, WORKER_SHUTDOWN = 0, 1, 2

TimerTask = Callable[["HashedWheelTimeout"], None]


class HashedWheelTimeout:
    """A scheduled task and its node in a bucket's doubly linked list."""

    __slots__ = ("bucket", "deadline", "next", "prev", "remaining_rounds", "state", "task", "timer")

    def __init__(self, timer: HashedWheelTimer, task: TimerTask, deadline: float) -> None:
        self.timer = timer
        self.task = task
        self.deadline = deadline  # seconds since the timer's start time
        self.state = ST_INIT
        self.remaining_rounds = 0
        self.bucket: HashedWheelBucket | None = None
        self.next: HashedWheelTimeout | None = None
        self.prev: HashedWheelTimeout | None = None

    @property
    def cancelled(self) -> bool:
        return self.state == ST_CANCELLED

    @property
    def expired(self) -> bool:
        return self.state == ST_EXPIRED

    def cancel(self) -> bool:
        """Mark cancelled; the worker unlinks it on its next tick. False if it already fired."""
        if not self.timer._compare_and_set(self, ST_INIT, ST_CANCELLED):
            return False
        self.timer._cancelled_timeouts.append(self)
        return True

    def _remove(self) -> None:
        # Worker thread, once per cancelled timeout (the CAS in cancel() admits one).
        if self.bucket is not None:
            self.bucket.remove(self)
        self.timer._count_pending(-1)

    def _expire(self) -> None:
        if self.timer._compare_and_set(self, ST_INIT, ST_EXPIRED):
            self.timer._count_pending(-1)
            self.timer._execute(self)


class HashedWheelBucket:
    """Timeouts that land on one slot of the wheel; head/tail list as in Netty."""

    __slots__ = ("head", "tail")

    def __init__(self) -> None:
        self.head: HashedWheelTimeout | None = None
        self.tail: HashedWheelTimeout | None = None

    def add_timeout(self, timeout: HashedWheelTimeout) -> None:
        timeout.bucket = self
        if self.tail is None:
            self.head = self.tail = timeout
        else:
            self.tail.next = timeout
            timeout.prev = self.tail
            self.tail = timeout

    def expire_timeouts(self, now: float) -> list[HashedWheelTimeout]:
        """Fire what is due this round, drop the cancelled, count down the rest.

        Returns the timeouts found early (see below) for the next tick's bucket.
        The pending count is not touched here: a timeout leaves it exactly once, when
        it expires or when its cancellation is processed, never twice if both race.
        """
        early: list[HashedWheelTimeout] = []
        timeout = self.head
        while timeout is not None:
            following = timeout.next
            if timeout.remaining_rounds <= 0:
                following = self.remove(timeout)
                if timeout.deadline <= now:
                    timeout._expire()
                else:
                    # Netty throws here ("placed into a wrong slot"); with float seconds a
                    # deadline on a tick boundary can round past it, so try the next tick.
                    early.append(timeout)
            elif timeout.cancelled:
                following = self.remove(timeout)
            else:
                timeout.remaining_rounds -= 1
            timeout = following
        return early

    def remove(self, timeout: HashedWheelTimeout) -> HashedWheelTimeout | None:
        following = timeout.next
        if timeout.prev is not None:
            timeout.prev.next = following
        if following is not None:
            following.prev = timeout.prev
        if timeout is self.head:
            if timeout is self.tail:
                self.head = self.tail = None
            else:
                self.head = following
        elif timeout is self.tail:
            self.tail = timeout.prev
        timeout.prev = timeout.next = None
        timeout.bucket = None
        return following

    def clear_timeouts(self, unprocessed: list[HashedWheelTimeout]) -> None:
        while (timeout := self.head) is not None:
            self.remove(timeout)
            if not timeout.expired and not timeout.cancelled:
                unprocessed.append(timeout)


class HashedWheelTimer:
    """Netty's timer. `start_worker=False` leaves the turning to `advance()` (tests, benchmarks)."""

    def __init__(
        self,
        tick_duration: float = 0.1,
        ticks_per_wheel: int = 512,
        *,
        clock: Clock = DEFAULT_CLOCK,
        max_pending_timeouts: int = 0,
        executor: Executor | None = None,
        start_worker: bool = True,
        name: str = "hashed-wheel-timer",
    ) -> None:
        if tick_duration <= 0 or ticks_per_wheel <= 0:
            raise ValueError("tick_duration and ticks_per_wheel must be positive")
        size = 1 << (ticks_per_wheel - 1).bit_length()  # next power of two, as Netty
        self._wheel = [HashedWheelBucket() for _ in range(size)]
        self._mask = size - 1
        self._tick_duration = tick_duration
        self._clock = clock
        self._max_pending = max_pending_timeouts
        self._executor = executor
        self._timeouts: deque[HashedWheelTimeout] = deque()
        self._cancelled_timeouts: deque[HashedWheelTimeout] = deque()
        self._pending = 0
        self._tick = 0
        self._lock = threading.Lock()  # state changes and the pending count
        self._worker_state = WORKER_INIT
        self._start_time: float | None = None
        self._interrupt = threading.Event()
        self._thread_started = threading.Event()
        self._unprocessed: list[HashedWheelTimeout] = []
        self._thread: threading.Thread | None = None
        if start_worker:
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def wheel_size(self) -> int:
        return self._mask + 1

    @property
    def pending_timeouts(self) -> int:
        return self._pending

    def start(self) -> None:
        """Start the worker; `new_timeout` does this lazily so an unused timer never ticks."""
        with self._lock:
            if self._worker_state == WORKER_SHUTDOWN:
                raise TimerClosedError("the hashed wheel timer")
            starting = self._worker_state == WORKER_INIT
            self._worker_state = WORKER_STARTED
            if starting and self._thread is None:
                self._start_time = self._clock()
        if starting and self._thread is not None:
            self._thread.start()
        if self._thread is not None:
            self._thread_started.wait()  # the worker sets the start time, as in Netty

    def new_timeout(self, task: TimerTask, delay: float) -> HashedWheelTimeout:
        """Run `task` once `delay` seconds have passed."""
        self.start()
        assert self._start_time is not None
        return self._add(task, self._clock() + delay - self._start_time)

    def new_timeout_at(self, task: TimerTask, due: float) -> HashedWheelTimeout:
        """Run `task` once the clock reads `due`."""
        self.start()
        assert self._start_time is not None
        return self._add(task, due - self._start_time)

    def advance(self) -> None:
        """Process every tick that has ended by now, on the calling thread (no worker)."""
        if self._thread is not None:
            raise TimerStateError("advance() is for timers built with start_worker=False")
        start = self._start_time
        if start is None or self._worker_state != WORKER_STARTED:
            return
        now = self._clock() - start
        while now >= self._tick_duration * (self._tick + 1):
            self._process_tick(now)

    def stop(self) -> list[HashedWheelTimeout]:
        """Stop the worker and return the timeouts that never fired, now cancelled."""
        if self._thread is not None and threading.current_thread() is self._thread:
            raise TimerStateError("stop() cannot be called from a timer task")
        with self._lock:
            was_started = self._worker_state == WORKER_STARTED
            self._worker_state = WORKER_SHUTDOWN
        if not was_started:
            return []
        if self._thread is not None:
            self._interrupt.set()
            self._thread.join()
        else:
            self._collect_unprocessed()
        with self._lock:
            self._pending = 0
        return [t for t in self._unprocessed if self._compare_and_set(t, ST_INIT, ST_CANCELLED)]

    # -- the worker ----------------------------------------------------------------
    def _run(self) -> None:
        self._start_time = self._clock()
        self._thread_started.set()
        while self._worker_state == WORKER_STARTED:
            now = self._wait_for_next_tick()
            if now is None:
                break
            self._process_tick(now)
        self._collect_unprocessed()

    def _wait_for_next_tick(self) -> float | None:
        assert self._start_time is not None
        deadline = self._tick_duration * (self._tick + 1)
        while True:
            current = self._clock() - self._start_time
            sleep = deadline - current
            if sleep <= 0:
                return current
            # Whole milliseconds, at least one, as Netty: the worker never spins.
            if self._interrupt.wait(math.ceil(sleep * 1000) / 1000):
                return None

    def _process_tick(self, now: float) -> None:
        self._process_cancelled_tasks()
        self._transfer_timeouts_to_buckets()
        bucket = self._wheel[self._tick & self._mask]
        early = bucket.expire_timeouts(now)
        self._tick += 1
        for timeout in early:
            timeout.remaining_rounds = 0
            self._wheel[self._tick & self._mask].add_timeout(timeout)

    def _transfer_timeouts_to_buckets(self) -> None:
        timeouts = self._timeouts
        tick = self._tick
        for _ in range(min(MAX_TRANSFER_PER_TICK, len(timeouts))):
            timeout = timeouts.popleft()
            if timeout.state == ST_CANCELLED:
                continue  # its cancellation was handled by _process_cancelled_tasks
            calculated = int(timeout.deadline // self._tick_duration)
            timeout.remaining_rounds = (calculated - tick) // len(self._wheel)
            # Already past: fire on this tick rather than a full turn later.
            self._wheel[max(calculated, tick) & self._mask].add_timeout(timeout)

    def _process_cancelled_tasks(self) -> None:
        cancelled = self._cancelled_timeouts
        while cancelled:
            timeout = cancelled.popleft()
            try:
                timeout._remove()
            except Exception:
                log.warning(
                    "an exception was thrown while processing a cancellation", exc_info=True
                )

    def _collect_unprocessed(self) -> None:
        unprocessed = self._unprocessed
        for bucket in self._wheel:
            bucket.clear_timeouts(unprocessed)
        while self._timeouts:
            timeout = self._timeouts.popleft()
            if not timeout.cancelled:
                unprocessed.append(timeout)
        self._process_cancelled_tasks()

    # -- shared state --------------------------------------------------------------
    def _add(self, task: TimerTask, deadline: float) -> HashedWheelTimeout:
        timeout = HashedWheelTimeout(self, task, deadline)
        with self._lock:
            # Checked under the lock stop() takes, so no add slips in after the final
            # drain and goes unreported.
            if self._worker_state != WORKER_STARTED:
                raise TimerClosedError("the hashed wheel timer")
            if 0 < self._max_pending <= self._pending:
                raise TimerRejectedError(self._pending + 1, self._max_pending)
            self._pending += 1
            self._timeouts.append(timeout)
        return timeout

    def _count_pending(self, delta: int) -> None:
        with self._lock:
            self._pending += delta

    def _compare_and_set(self, timeout: HashedWheelTimeout, expect: int, update: int) -> bool:
        with self._lock:
            if timeout.state != expect:
                return False
            timeout.state = update
            return True

    def _execute(self, timeout: HashedWheelTimeout) -> None:
        if self._executor is not None:
            self._executor.submit(_run_task, timeout)
        else:
            _run_task(timeout)


def _run_task(timeout: HashedWheelTimeout) -> None:
    try:
        timeout.task(timeout)
    except Exception:
        log.warning("an exception was thrown by the timer task of %r", timeout, exc_info=True)
