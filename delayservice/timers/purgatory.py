"""Kafka's `DelayedOperationPurgatory`: operations that finish on an event or on a timeout.

A `DelayedOperation` waits for a condition (Kafka: the high watermark passes a
produce request's offset) under a deadline. It is watched under one or more keys;
whoever changes what a key stands for calls `check_and_complete(key)`. When the
deadline comes first, the `SystemTimer` expires it. Both paths meet in
`force_complete`, which lets exactly one caller run `on_complete`.

A completed operation stays in the watcher lists of its other keys until a check
visits them, so the purgatory estimates how many completed operations are still
watched (operations ever watched minus those still in the timer) and purges the
lists once that estimate passes `purge_interval`.

Time is integer milliseconds on the timer's clock (see `system_timer`).
"""

from __future__ import annotations

import logging
import threading
from abc import abstractmethod
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar, cast

from delayservice.timers.system_timer import SystemTimer, TimerTask

log = logging.getLogger(__name__)

WATCHER_LIST_COUNT = 512
"""Shards of the key map, each with its own lock (Kafka's `WatcherListCount`)."""

REAPER_POLL_MS = 200
"""How long the reaper blocks on the timer before it checks for shutdown and purges."""


class DelayedOperation(TimerTask):
    """An operation that completes when `try_complete` succeeds or its delay runs out."""

    def __init__(self, delay_ms: int, lock: threading.RLock | None = None) -> None:
        super().__init__(delay_ms)
        # Kafka's AtomicBoolean: the lock stands in for compareAndSet.
        self._completed = False
        self._completed_lock = threading.Lock()
        # Serialises try_complete across threads; callers may share one between operations.
        self.lock = lock if lock is not None else threading.RLock()

    def force_complete(self) -> bool:
        """Complete now unless someone already did; True only for the caller that did."""
        with self._completed_lock:
            if self._completed:
                return False
            self._completed = True
        self.cancel()  # out of the timer: it must not expire later
        self.on_complete()
        return True

    @property
    def is_completed(self) -> bool:
        return self._completed

    @abstractmethod
    def try_complete(self) -> bool:
        """Check the condition; if met, call `force_complete` and return its result."""

    @abstractmethod
    def on_complete(self) -> None:
        """The operation's result (Kafka: send the response). Runs exactly once."""

    @abstractmethod
    def on_expiration(self) -> None:
        """Extra work when the deadline, not the condition, completed the operation."""

    def run(self) -> None:
        # The timer calls this when the delay has passed.
        if self.force_complete():
            self.on_expiration()

    def safe_try_complete(self) -> bool:
        with self.lock:
            return self.try_complete()

    def safe_try_complete_or_else(self, watch: Callable[[], None]) -> bool:
        """Try, watch on failure, then try once more: an event between the first try and
        the watch would otherwise find nobody watching and be lost."""
        with self.lock:
            if self.try_complete():
                return True
            watch()
            return self.try_complete()


Op = TypeVar("Op", bound=DelayedOperation)


class _Watchers(Generic[Op]):
    """The operations watched under one key, oldest first."""

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self._ops: list[Op] = []
        self._lock = threading.Lock()

    def watch(self, op: Op) -> None:
        with self._lock:
            self._ops.append(op)

    def count_watched(self) -> int:
        return len(self._ops)

    def is_empty(self) -> bool:
        return not self._ops

    def try_complete_watched(self) -> int:
        # Try outside our lock: try_complete may complete operations that check other keys.
        with self._lock:
            ops = list(self._ops)
        completed = sum(1 for op in ops if not op.is_completed and op.safe_try_complete())
        self._drop_completed()
        return completed

    def purge_completed(self) -> int:
        return self._drop_completed()

    def cancel(self) -> list[Op]:
        with self._lock:
            ops, self._ops = self._ops, []
        for op in ops:
            op.cancel()
        return ops

    def _drop_completed(self) -> int:
        with self._lock:
            before = len(self._ops)
            self._ops = [op for op in self._ops if not op.is_completed]
            return before - len(self._ops)


class _WatcherList(Generic[Op]):
    def __init__(self) -> None:
        self.watchers_by_key: dict[Hashable, _Watchers[Op]] = {}
        self.lock = threading.Lock()


class DelayedOperationPurgatory(Generic[Op]):
    """Watches operations by key and expires them through a `SystemTimer`."""

    def __init__(
        self,
        name: str,
        timer: SystemTimer | None = None,
        purge_interval: int = 1000,
        reaper_enabled: bool = True,
        timer_enabled: bool = True,
    ) -> None:
        self.name = name
        self._timer = timer if timer is not None else SystemTimer(f"executor-{name}")
        self._purge_interval = purge_interval
        self._timer_enabled = timer_enabled
        self._watcher_lists: list[_WatcherList[Op]] = [
            _WatcherList() for _ in range(WATCHER_LIST_COUNT)
        ]
        self._estimated_total = 0
        self._estimate_lock = threading.Lock()
        self._stopping = threading.Event()
        self._reaper: threading.Thread | None = None
        if reaper_enabled:
            self._reaper = threading.Thread(
                target=self._reap, name=f"ExpirationReaper-{name}", daemon=True
            )
            self._reaper.start()

    # -- the two entry points ------------------------------------------------------
    def try_complete_else_watch(self, op: Op, watch_keys: Iterable[Hashable]) -> bool:
        """Complete `op` now if it can; otherwise watch it under every key and start its timer.

        True when it completed here.
        """
        keys = list(watch_keys)
        if not keys:
            raise ValueError("the watch key list can't be empty")

        def watch() -> None:
            for key in keys:
                self._watch_for_operation(key, op)
            self._add_to_estimate(1)

        if op.safe_try_complete_or_else(watch):
            return True
        if not op.is_completed:
            if self._timer_enabled:
                self._timer.add(op)
            if op.is_completed:
                op.cancel()  # completed between the check and the add: no timeout needed
        return False

    def check_and_complete(self, key: Hashable) -> int:
        """Something `key` stands for changed: try the operations watching it.

        Returns how many this call completed.
        """
        wl = self._watcher_list(key)
        with wl.lock:
            watchers = wl.watchers_by_key.get(key)
        if watchers is None:
            return 0
        completed = watchers.try_complete_watched()
        if watchers.is_empty():
            self._remove_key_if_empty(key, watchers)
        return completed

    def cancel_for_key(self, key: Hashable) -> list[Op]:
        """Stop watching `key` and take its operations out of the timer, uncompleted."""
        wl = self._watcher_list(key)
        with wl.lock:
            watchers = wl.watchers_by_key.pop(key, None)
        cancelled = watchers.cancel() if watchers is not None else []
        self._add_to_estimate(-len(cancelled))
        return cancelled

    # -- the reaper ----------------------------------------------------------------
    def advance_clock(self, timeout_ms: int) -> None:
        """One round of the reaper: expire what is due, then purge if the estimate says so."""
        self._timer.advance_clock(timeout_ms)
        delayed = self.num_delayed
        with self._estimate_lock:
            due = self._estimated_total - delayed > self._purge_interval
            if due:
                self._estimated_total = delayed
        if due:
            purged = sum(
                watchers.purge_completed()
                for wl in self._watcher_lists
                for watchers in self._all_watchers(wl)
            )
            log.debug("purgatory %s purged %d completed operations", self.name, purged)

    @property
    def watched(self) -> int:
        """Watch entries, counting an operation once per key and completed ones not yet purged."""
        return sum(w.count_watched() for wl in self._watcher_lists for w in self._all_watchers(wl))

    @property
    def num_delayed(self) -> int:
        """Operations waiting in the timer."""
        return self._timer.size

    def shutdown(self) -> list[Op]:
        """Stop the reaper and the timer; return the operations that neither completed nor
        expired, so the caller can answer them rather than lose them."""
        self._stopping.set()
        if self._reaper is not None:
            self._timer.wakeup()
            self._reaper.join()
        pending = self._timer.shutdown()
        # The timer holds only what this purgatory added: operations of type Op.
        waiting = [op for op in pending if isinstance(op, DelayedOperation)]
        return cast("list[Op]", [op for op in waiting if not op.is_completed])

    # -- internals -----------------------------------------------------------------
    def _reap(self) -> None:
        while not self._stopping.is_set():
            try:
                self.advance_clock(REAPER_POLL_MS)
            except Exception:
                log.exception("expiration reaper of %s failed a round", self.name)

    def _watcher_list(self, key: Hashable) -> _WatcherList[Op]:
        return self._watcher_lists[hash(key) % WATCHER_LIST_COUNT]

    def _all_watchers(self, wl: _WatcherList[Op]) -> list[_Watchers[Op]]:
        with wl.lock:
            return list(wl.watchers_by_key.values())

    def _watch_for_operation(self, key: Hashable, op: Op) -> None:
        wl = self._watcher_list(key)
        with wl.lock:
            watchers = wl.watchers_by_key.get(key)
            if watchers is None:
                watchers = wl.watchers_by_key[key] = _Watchers(key)
            watchers.watch(op)

    def _remove_key_if_empty(self, key: Hashable, watchers: _Watchers[Op]) -> None:
        # Under the list lock, so a concurrent watch cannot land in a removed Watchers.
        wl = self._watcher_list(key)
        with wl.lock:
            if wl.watchers_by_key.get(key) is watchers and watchers.is_empty():
                del wl.watchers_by_key[key]

    def _add_to_estimate(self, delta: int) -> None:
        with self._estimate_lock:
            self._estimated_total += delta
