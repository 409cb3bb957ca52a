"""Two threads through the marker gate in one chosen order, with no timing in it: a
second thread's work lands in the middle of the gate's walk over its waiting list, as
the scheduler may make it land, unless the gate's lock holds it back.

The walker (the reader, moving the gate or looking for the next wanted time) starts the
other thread at a chosen point of its walk and waits until that thread has finished or
waits for the gate's lock, whichever comes first: so only one of the two runs at a time,
and what runs next is decided, not raced. When the walker lets the lock go, it waits for
the other thread to finish before it goes on. Unguarded, the other thread's ask lands in
the walk: the walk breaks ("dictionary changed size during iteration"), or the dict the
walk built and stores drops the ask. Guarded, the ask waits for the walk and is kept.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from delayservice.level.markers.gate import MarkerGate

STUCK_S = 10.0
"""How long the walker waits for the other thread to finish or block on the gate's
lock before it says the other thread is stuck elsewhere."""


class StuckElsewhereError(AssertionError):
    """The other thread neither finished nor waited for the gate's lock: it waits on
    something else the walker holds, and the order cannot be kept."""


class WatchedLock:
    """The gate's lock, telling the walker when another thread waits for it, and making
    the walker wait for that thread once it lets the lock go."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self.waiting = threading.Event()
        self.other: threading.Thread | None = None
        self.walker: threading.Thread | None = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(blocking=False):
            return True
        if not blocking:
            return False
        if self.walker is not None and threading.current_thread() is not self.walker:
            self.waiting.set()  # the other thread, or one it started, waits for the walk
        return bool(self._lock.acquire(True, timeout))

    def release(self) -> None:
        self._lock.release()
        other = self.other
        if other is not None and threading.current_thread() is self.walker:
            self.other = self.walker = None
            other.join(STUCK_S)
            if other.is_alive():
                raise StuckElsewhereError(f"{other.name} did not finish after the walk")

    def locked(self) -> bool:
        return bool(self._lock.locked())

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class RunDuringWalk(dict[Any, Any]):
    """The gate's waiting list, whose first walk over `at` ("values" or "items") runs
    `work` on another thread: after the walk's first entry, or, `copied`, once the walk
    is over and only its result is left to store. Used once: `done` says whether it ran."""

    def __init__(self, lock: WatchedLock, work: Callable[[], None], at: str, *, copied: bool):
        super().__init__()
        self._lock = lock
        self._work = work
        self._at = at
        self._copied = copied
        self.done = False

    def _interleave(self) -> None:
        if self.done:
            return
        self.done = True
        other = threading.Thread(target=self._work, name="during-walk", daemon=True)
        self._lock.waiting.clear()
        self._lock.other, self._lock.walker = other, threading.current_thread()
        other.start()
        for _ in range(int(STUCK_S / 0.001)):
            other.join(0.001)
            if not other.is_alive() or self._lock.waiting.is_set():
                return
        raise StuckElsewhereError(f"{other.name} neither finished nor waited for the gate")

    def _walk(self, at: str, entries: Iterator[Any]) -> Iterator[Any]:
        if at != self._at or self.done:
            yield from entries
            return
        if self._copied:
            yield from list(entries)
            self._interleave()
            return
        for n, entry in enumerate(entries):
            yield entry
            if n == 0:
                self._interleave()

    def values(self) -> Any:
        return self._walk("values", iter(super().values()))

    def items(self) -> Any:
        return self._walk("items", iter(super().items()))


def run_during_walk(
    gate: MarkerGate, work: Callable[[], None], at: str, *, copied: bool
) -> tuple[RunDuringWalk, Callable[[], None]]:
    """Arm `gate` so that its next walk over `at` runs `work` as above; returns the
    armed list and the call that disarms the gate again (its lock and a plain dict)."""
    original = gate._lock
    watched = WatchedLock(original)
    racing = RunDuringWalk(watched, work, at, copied=copied)
    racing.update(gate._wants)
    gate._wants = racing
    gate._lock = watched  # type: ignore[assignment]

    def disarm() -> None:
        gate._lock = original
        gate._wants = dict(gate._wants)

    return racing, disarm
