"""Partitions handed over from the consumer thread to the forwarder thread.

On revoke or loss the consumer thread must not return from its rebalance callback while
the forwarder still holds anything of the partitions: their new owner reads the
committed offsets as soon as it returns, and a record of theirs left here could be sent
and committed after that. So the consumer thread asks and waits, and the forwarder
thread, which owns the producer and the transaction, commits or drops what it holds of
them and forgets them; once that thread is gone, the consumer thread does it itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from delayservice.forward.buffer import TP
from delayservice.forward.checkpoint import Checkpoint
from delayservice.forward.inbox import HandOver
from delayservice.forward.producer_rebuild import ProducerRebuild
from delayservice.forward.send_errors import ForwarderFatalError
from delayservice.kafka.client_errors import lost_client_error, raised_by
from delayservice.metrics.service_metrics import ServiceMetrics

log = logging.getLogger(__name__)

HANDOVER_WAIT_S: Final = 20.0
"""How often a consumer thread still waiting for a hand-over says so. It never gives up
while the forwarder lives: returning with the outcome open would let the forwarder
commit records of a partition after its new owner has read the offsets."""


class Handovers:
    def __init__(
        self,
        name: str,
        checkpoint: Checkpoint,
        rebuild: ProducerRebuild,
        metrics: ServiceMetrics,
        on_fatal: Callable[[str], None],
        serving: Callable[[], bool],
    ) -> None:
        """`serving`: whether the forwarder thread still lives to serve requests."""
        self.name = name
        self._checkpoint = checkpoint
        self._rebuild = rebuild
        self._on_fatal = on_fatal
        self._serving = serving
        self._m_loop_errors = metrics.loop_errors.labels(name, "forwarder")
        self._inbox = checkpoint.inbox

    def handover(self, partitions: set[TP], *, commit: bool) -> dict[TP, int] | None:
        """Called by the consumer thread on revoke (`commit`) or loss: the forwarder
        reaches a commit point (or drops without one) and lets `partitions` go. Returns
        the offsets now durable for them (at-least-once: the caller commits them; in
        exactly-once they are committed already), None when that failed."""
        if self._serving():
            request = self._inbox.ask_hand_over(partitions, commit=commit)
            said = time.monotonic()
            while not request.done.wait(0.05):
                if not self._serving():
                    if self._inbox.withdraw(request):
                        self._serve(request)  # the thread ended before it saw the request
                    break
                if time.monotonic() - said > HANDOVER_WAIT_S:
                    said = time.monotonic()
                    log.warning(
                        "%s: still waiting for the forwarder to hand over %s",
                        self.name,
                        sorted(partitions),
                    )
        else:
            request = HandOver(set(partitions), commit)
            self._serve(request)  # the forwarder thread is gone: its state is ours now
        return request.offsets if request.ok else None

    def serve(self) -> None:
        """On the forwarder thread: serve the requests waiting."""
        for request in self._inbox.hand_overs():
            self._serve(request)

    def _serve(self, request: HandOver) -> None:
        """Commit (revoke) or drop (loss) what the open interval holds, then forget every
        trace of `request.partitions`, on every path: a record of theirs left anywhere
        here could be sent and committed after their new owner read the offsets. The
        open transaction is ended first (committed, aborted, or fenced by a new
        producer), so it never holds them past this call."""
        gone = request.partitions
        checkpoint = self._checkpoint
        try:
            try:
                self._hand_over(request)
            except ForwarderFatalError:
                raise
            except Exception as exc:
                self._m_loop_errors.inc()
                if lost_client_error(exc):  # at a fence, as in `step`: no trace to show
                    log.warning(
                        "%s: handing over %s: a producer call lost its error (%s)",
                        self.name,
                        sorted(gone),
                        exc,
                    )
                else:
                    log.exception("%s: handing over %s failed", self.name, sorted(gone))
                request.ok = False
                checkpoint.end_transaction()
        except ForwarderFatalError as exc:
            request.ok = False
            checkpoint.interval.drop(gone)  # never sent again, whatever happens next
            try:
                self._rebuild.rebuild(exc)
            except ForwarderFatalError as final:
                self._on_fatal(str(final))
        finally:
            checkpoint.forget(gone)
            request.done.set()

    def _hand_over(self, request: HandOver) -> None:
        """`_serve`'s commit or drop; a bare `KafkaError` comes out as the exception
        it should have been (`client_errors.raised_by`), handled as that would be."""
        gone = request.partitions
        checkpoint = self._checkpoint

        def commit_or_drop() -> None:
            if request.commit:
                request.ok = checkpoint.commit_point()
            else:
                checkpoint.abandon(gone)
                request.ok = True

        raised = raised_by(commit_or_drop)
        if raised is not None:
            raise raised
        committed = checkpoint.interval.committed
        request.offsets = {tp: o for tp, o in committed.items() if tp in gone}
