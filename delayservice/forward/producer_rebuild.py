"""Replacing a forwarder's producer once it failed for good.

A producer librdkafka flagged fatal never sends again, and one the transaction
coordinator fenced never commits again; the forwarder goes on through a new one rather
than ending its worker. A fence also comes from a second live process with this
instance's transactional id, which a new producer would only fence back: so a
replacement that keeps being needed ends the worker instead (`REBUILDS`), unless the
other holder is one by design (`SharedId`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from delayservice.forward.checkpoint import Checkpoint
from delayservice.forward.send_errors import ForwarderFatalError, SendLaterError
from delayservice.forward.sender import RecordSender

log = logging.getLogger(__name__)

REBUILDS: Final = 5
REBUILD_WINDOW_S: Final = 300.0


@dataclass(frozen=True)
class SharedId:
    """Two holders of the same partitions forward under one transactional id, so the
    coordinator lets one of them commit at a time (precise mode with two copies: the
    owner, and its replica when it takes over). Being fenced by the other is then part
    of the protocol, not a sign of a second live process with this instance's name: it
    does not count towards `REBUILDS`. `lazy`: the holder that takes over inits its
    producer only when it has something to send (`ensure_transaction`), and once
    fenced holds off for `hold_back_s`, so that the owner, back, goes on first."""

    other: str
    lazy: bool = False
    hold_back_s: float = 0.0


class ProducerRebuild:
    """The forwarder's producer, and its replacement. Owned by the forwarder thread
    (the consumer thread's, once that thread is gone: `handovers`)."""

    def __init__(
        self,
        name: str,
        producer: Any,
        make: Callable[[], Any] | None,
        checkpoint: Checkpoint,
        sender: RecordSender,
        shared: SharedId | None,
        clock: Any,
    ) -> None:
        """`make`: a new producer like `producer` (None: none can be made)."""
        self.name = name
        self.producer = producer
        self.make = make
        self.recent: deque[float] = deque()
        """When the producer was last replaced (not counting fences by `shared`)."""
        self._checkpoint = checkpoint
        self._sender = sender
        self._shared = shared
        self._clock = clock
        self._held_back_until = 0.0

    def rebuild(self, failure: ForwarderFatalError) -> None:
        """Replace a producer that failed for good: everything sent since the last
        commit goes back to the buffer and is sent again through a new one (whose
        init_transactions ends the old one's transaction). A fenced producer is
        replaced too: the coordinator fences a producer whose transaction outlived its
        timeout (a process frozen or starved that long) just as it fences one whose
        transactional id a newer process took. Raises `failure` when no new one can be
        made, or when it keeps happening (`REBUILDS` in `REBUILD_WINDOW_S`: for a fence,
        another live process with the same instance name)."""
        now = self._clock.monotonic()
        while self.recent and now - self.recent[0] > REBUILD_WINDOW_S:
            self.recent.popleft()
        shared = self._shared if failure.fenced else None
        if self.make is None or (shared is None and len(self.recent) >= REBUILDS):
            raise failure
        if shared is None:
            self.recent.append(now)
            log.error("%s: %s; replacing the producer", self.name, failure)
        else:
            log.warning("%s: fenced by %s; replacing the producer", self.name, shared.other)
        checkpoint = self._checkpoint
        checkpoint.producer_lost()
        old = self.producer
        try:
            old.purge()
        except Exception as exc:  # a failed client may refuse even this
            log.warning("%s: purging the failed producer: %s", self.name, exc)
        self.producer = self.make()
        self._sender.replace_producer(self.producer)
        checkpoint.txn.replace(self.producer)
        if shared is not None and shared.lazy:  # the owner is back: let it go on first
            self._held_back_until = now + shared.hold_back_s
            return
        if checkpoint.transactional:
            try:  # fence now: the old transaction ends (committed or aborted) at once
                checkpoint.txn.init()
            except (SendLaterError, ForwarderFatalError) as exc:  # the next send tries again
                log.warning("%s: %s; fencing at the next send", self.name, exc)

    def ensure_transaction(self) -> float:
        """A lazy forwarder (`SharedId.lazy`), on its own thread, about to send: init
        its producer (fencing the other holder) and learn, and return 0; or, fenced
        lately, the seconds it still holds off. Raises as `Transaction.init`."""
        left = float(self._held_back_until - self._clock.monotonic())
        if left > 0:
            return left
        self._checkpoint.txn.init()
        return 0.0
