"""What crosses between a worker's consumer thread and its forwarder thread, but the
records themselves (the `Buffer`, under its own lock): one object, so that a reader
sees every crossing in one place, and no other state is shared by the two.

- consumer -> forwarder: partitions to hand over on revoke or loss (`HandOver`,
  answered when done), and the consumer's group metadata (exactly-once);
- forwarder -> consumer: offsets made durable, to commit (at-least-once); a re-read
  from the committed offsets after an unknown outcome (`ask_reseek`), which the
  consumer thread ends with `reseek_done`; and the earliest due time of the records set
  aside for a backoff, for its gauges and for readiness.

Each side only calls its own methods; the lock guards the lists and the offsets.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from delayservice.forward.buffer import TP


@dataclass
class HandOver:
    """A request of the consumer thread: let `partitions` go, committed (`commit`, a
    revoke) or dropped (a loss). `done` is set once served; `ok` and `offsets` say how."""

    partitions: set[TP]
    commit: bool
    done: threading.Event = field(default_factory=threading.Event)
    offsets: dict[TP, int] = field(default_factory=dict)
    ok: bool = False


class Inbox:
    def __init__(self, wake: Callable[[], None]) -> None:
        """`wake`: wakes the forwarder from its sleep (`Buffer.wake`)."""
        self._wake = wake
        self._lock = threading.Lock()
        self._hand_overs: list[HandOver] = []
        self._durable: dict[TP, int] = {}
        self._reseek = threading.Event()
        self.group_metadata: Any = None
        """The consumer's group metadata (exactly-once): written whole by the consumer
        thread at each assignment, read by the forwarder's next commit."""
        self.set_aside_due_by_topic: dict[str, int] = {}
        """Per level topic, the earliest due time among the records set aside for a
        backoff (a record waiting out a backoff is held, and overdue): replaced whole by
        the forwarder, read by the consumer thread's gauges."""
        self.set_aside_due_ms: int | None = None
        """The earliest of them, for readiness (`Forwarder.stalled`)."""

    # -- hand-overs ------------------------------------------------------------------
    def ask_hand_over(self, partitions: set[TP], *, commit: bool) -> HandOver:
        """Consumer thread: queue a hand-over and wake the forwarder."""
        request = HandOver(set(partitions), commit)
        with self._lock:
            self._hand_overs.append(request)
        self._wake()
        return request

    def withdraw(self, request: HandOver) -> bool:
        """Consumer thread, once the forwarder thread is gone: take `request` back,
        unless the forwarder took it first (True when it was still queued)."""
        with self._lock:
            if request in self._hand_overs:
                self._hand_overs.remove(request)
                return True
        return False

    def hand_overs(self) -> list[HandOver]:
        """Forwarder thread: the requests queued, taken."""
        if not self._hand_overs:  # a peek, on every pass: one read of a reference
            return []
        with self._lock:
            requests, self._hand_overs = self._hand_overs, []
        return requests

    # -- durable offsets -------------------------------------------------------------
    def made_durable(self, offsets: dict[TP, int]) -> None:
        """Forwarder thread: `offsets` may be committed."""
        with self._lock:
            self._durable.update(offsets)

    def take_durable(self) -> dict[TP, int]:
        """Consumer thread: offsets made durable since the last call, to commit."""
        with self._lock:
            durable, self._durable = self._durable, {}
        return durable

    def forget(self, tps: set[TP]) -> None:
        """Forwarder thread: `tps` are no longer the worker's; nothing of theirs is
        committed by this member any more."""
        with self._lock:
            for tp in tps:
                self._durable.pop(tp, None)

    def set_aside(self, by_topic: dict[str, int]) -> None:
        """Forwarder thread: the records set aside changed (`set_aside_due_by_topic`)."""
        self.set_aside_due_by_topic = by_topic
        self.set_aside_due_ms = min(by_topic.values(), default=None)

    # -- the re-read -----------------------------------------------------------------
    def ask_reseek(self) -> None:
        """Forwarder thread: the consumer thread is to drop the queues and seek every
        owned partition back to its committed offset; nothing is taken meanwhile."""
        self._reseek.set()

    def reseek_wanted(self) -> bool:
        return self._reseek.is_set()

    def reseek_done(self) -> None:
        """Consumer thread: sought back; the forwarder may take again."""
        self._reseek.clear()
        self._wake()
