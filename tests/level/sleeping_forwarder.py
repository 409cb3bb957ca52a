"""The forwarder's sleep, for a simulation that steps the worker from one thread.

The real forwarder sleeps in `PartitionGroup.wait` until its earliest record may be
taken, a deadline, a notify of the group's condition (it then looks again) or a wake.
A simulation that runs the forwarder's pass whenever it likes never sleeps, so it
cannot see a wake-up that never comes: a record that could go now, left until some
other event happens to wake the forwarder. Nor does it run `_ready_s` under the lock
its caller holds, where a version that took the lock again deadlocked on the first
flood of markers. `SleepingAlarm` does both: where the real sleep would block, it notes
until when and raises `Asleep` out of the pass; the forwarder runs again only once it
is woken, notified or its time comes; and `missed` names a record it may take while it
sleeps on."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

from delayservice.forward.buffer import NEVER, Alarm
from delayservice.level.partition_group import PartitionGroup

HEAD_TIMEOUT_S = 5.0
"""Real seconds `head()` may take under the lock before it counts as a deadlock."""


class Asleep(Exception):  # noqa: N818 - a state the pass ends in, not an error
    """The forwarder's pass ended where the real one would block."""


class _Noticing(threading.Condition):
    """The group's condition, noting each notify: a sleeper looks again after one."""

    def __init__(self, lock: Any) -> None:
        super().__init__(lock)
        self.notified = False

    def notify(self, n: int = 1) -> None:
        self.notified = True
        super().notify(n)

    def notify_all(self) -> None:
        self.notified = True
        super().notify_all()


class SleepingAlarm(Alarm):
    def __init__(self, cond: _Noticing, clock: Callable[[], float]) -> None:
        super().__init__(cond, clock)
        self._noticing = cond
        self.until: float | None = None
        """Until when (clock seconds, NEVER: a wake only) the forwarder sleeps; None:
        it is awake."""
        self.deadlock = ""
        """Set when `head()` did not return under the lock its caller holds."""

    @classmethod
    def install(cls, group: PartitionGroup) -> SleepingAlarm:
        """Put the sleeping alarm in `group`, on a noticing condition over its lock and
        on its clock."""
        cond = _Noticing(group._cond._lock)  # type: ignore[attr-defined]
        group._cond = cond
        alarm = cls(cond, group._clock)
        group._alarm = alarm
        return alarm

    def awake(self) -> bool:
        """Whether the forwarder's thread would be running now."""
        return (
            self.until is None
            or self._woken
            or self._noticing.notified
            or self._clock() >= self.until
        )

    def sleep(self, deadline: float, head: Callable[[], float]) -> None:
        with self._cond:
            self._noticing.notified = False
            if self._woken:
                self._woken = False
                self.until = None
                return
            until = min(self._head_in_thread(head), deadline)
            if until <= self._clock():
                self.until = None
                return
            self.until = until
        raise Asleep(until)

    def _head_in_thread(self, head: Callable[[], float]) -> float:
        """`head()` on another thread while this one holds the lock, as the real sleep
        runs it: one that takes the lock again never returns."""
        out: list[float] = []
        failed: list[BaseException] = []

        def run() -> None:
            try:
                out.append(head())
            except BaseException as exc:
                failed.append(exc)

        helper = threading.Thread(target=run, name="sleeping-alarm-head", daemon=True)
        helper.start()
        helper.join(HEAD_TIMEOUT_S)
        if failed:
            raise failed[0]
        if not out:
            self.deadlock = f"head() did not return in {HEAD_TIMEOUT_S}s under the group's lock"
            return NEVER
        return out[0]

    def missed(self, group: PartitionGroup) -> str | None:
        """What the group would hand out now while its forwarder sleeps on with no wake
        on its way: a lost wake-up (None when it is awake, or nothing is missed)."""
        if self.awake():
            return None
        now = self._clock()
        now_ms = int(now * 1000)
        markers = group._markers
        with self._cond:
            heads = [(key, tp, "held") for key, tp in group._heap]
            for tp, _, records, read_ms in group._handed:
                kind, stamp = records[0].timestamp()
                appended = stamp if kind == TIMESTAMP_LOG_APPEND_TIME else read_ms
                heads.append((appended + group._delays[tp[0]][0], tp, "handed over"))
            for key, tp, where in heads:
                if key <= now_ms and (markers is None or key <= markers.through_ms(tp[1])):
                    return f"{tp[0]}[{tp[1]}] {where}, due at {key} ms, its markers read through it"
        return None
