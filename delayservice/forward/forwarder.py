"""The forwarder thread: sends due records, and commits like Kafka Streams.

One forwarder serves every delay topic its worker reads (one level, several levels,
or a precise topic), through one producer and, exactly-once, one transaction. It
sleeps on the buffer's condition until the earliest partition head is due or the next
commit point, and is woken early when an earlier head arrives. Each due record is sent
as it is (key, value, the user's headers plus `delay-id` and `delay-due-ms`), with no
delivery callback of its own: the producer reports only failures.

At each commit point (every `commit_interval`, sooner once nothing is due, but never
more often than `floor`) what it sent is made durable and each partition's committable
offset moves to the one after the last record sent: flushed, the offsets going to the
consumer thread (at-least-once), or committed in one transaction with them
(exactly-once). `checkpoint.Checkpoint` owns that commit state, and precise mode's
`settle` and `ledger` with it.

A refusal makes the interval's partitions go again from the failed record
(`failures.Failures` decides doom or retry); in exactly-once the transaction is
aborted first and everything it held goes again, so a read_committed reader sees each
record once. A record whose envelope asks for more than its level is re-published
once, with its absolute due time, to where it fits (the precise topic when precise mode
runs, else the smallest level that holds what remains) and its partition moves on.

No exception from one record escapes a send; the loop survives anything else. Partitions
revoked or lost are let go through `handovers`, and a producer that failed for good is
replaced through `producer_rebuild`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from delayservice.forward.buffer import TP, Buffer, Runs
from delayservice.forward.checkpoint import Checkpoint
from delayservice.forward.failures import Failures, Key
from delayservice.forward.handovers import Handovers
from delayservice.forward.inbox import Inbox
from delayservice.forward.open_interval import OpenInterval
from delayservice.forward.producer_rebuild import ProducerRebuild, SharedId
from delayservice.forward.send_errors import ForwarderFatalError, SendLaterError, producer_failed
from delayservice.forward.sender import RecordSender, Routes
from delayservice.forward.transaction_ledger import TransactionLedger
from delayservice.kafka.client_errors import fatal_error_in, lost_client_error, raised_by
from delayservice.kafka.target_topics import TargetTopics
from delayservice.kafka.unconfirmed_acks import UnconfirmedAcks
from delayservice.levels import Level
from delayservice.log_throttle import Throttle
from delayservice.metrics.heartbeat import Heartbeat
from delayservice.metrics.service_metrics import ServiceMetrics

__all__ = ["Forwarder", "ForwarderFatalError", "Routes", "SharedId"]

log = logging.getLogger(__name__)

TAKE: Final = 5_000
"""Records taken per pass: a burst goes out while the rest still waits in the buffer."""
RESEEK_POLL_S: Final = 0.05


class Forwarder:
    def __init__(
        self,
        levels: Sequence[Level],
        group: Buffer,
        producer: Any,
        targets: TargetTopics,
        routes: Routes,
        metrics: ServiceMetrics,
        on_fatal: Callable[[str], None],
        *,
        name: str,
        transactional: bool,
        unconfirmed: UnconfirmedAcks,
        commit_interval_s: float,
        flush_timeout_s: float,
        backoff: tuple[float, float] = (1.0, 30.0),
        give_up_s: float = 300.0,
        clock: Any = time,
        make_producer: Callable[[], Any] | None = None,
        settle: Callable[[Runs], None] | None = None,
        ledger: TransactionLedger | None = None,
        shared_id: SharedId | None = None,
    ) -> None:
        """`levels`: the delay topics it forwards (their records come from `group`);
        `name`: its worker's, for threads, messages and the per-worker metrics.
        `producer` is its own, built with `on_delivery=self.on_report` and
        `delivery.report.only.error` (and a `transactional.id` when `transactional`),
        its log lines going through `unconfirmed` (`watch_unconfirmed`). `settle` is
        handed, at each commit point, the records it made durable (precise mode settles
        them in its slots; see `PreciseWorker`). `ledger` (exactly-once, precise mode):
        what the transactions carry instead of consumer offsets. `shared_id`: another
        holder uses its transactional id too, by design (see `SharedId`)."""
        self.levels = {level.topic: level for level in levels}
        self.name = name
        self.group = group
        self._on_fatal = on_fatal
        self.transactional = transactional
        self._clock = clock
        self._lazy = shared_id is not None and shared_id.lazy
        self._metrics = metrics
        self._m_loop_errors = metrics.loop_errors.labels(name, "forwarder")
        self.failures = Failures(
            routes.dead_letter_topic, backoff, give_up_s, self._count_retry, clock.monotonic
        )
        self._stopping = threading.Event()
        self.interval = OpenInterval(group)
        """What was sent since the last commit point."""
        self.sender = RecordSender(
            self.levels,
            group,
            producer,
            targets,
            routes,
            metrics,
            self.failures,
            self._stopping,
            clock,
            name,
            self.interval,
        )
        self.on_report = self.sender.on_report
        """The producer's delivery callback (`on_delivery`): failures only."""
        self.inbox = Inbox(group.wake)
        """All the consumer thread and this one exchange, but the records (`group`)."""
        self.checkpoint = Checkpoint(
            name,
            self.levels,
            group,
            self.interval,
            self.sender,
            self.failures,
            metrics,
            self._stopping,
            clock,
            producer=producer,
            transactional=transactional,
            unconfirmed=unconfirmed,
            commit_interval_s=commit_interval_s,
            flush_timeout_s=flush_timeout_s,
            settle=settle,
            ledger=ledger,
            inbox=self.inbox,
        )
        self.rebuild = ProducerRebuild(
            name, producer, make_producer, self.checkpoint, self.sender, shared_id, clock
        )
        self.heartbeat = Heartbeat(clock.monotonic)
        """Beats once per turn of the send loop (`stalled` says when one lasts)."""
        self._throttle = Throttle()
        self._thread = threading.Thread(target=self._main, name=f"forwarder-{name}", daemon=True)
        self.handovers = Handovers(
            name, self.checkpoint, self.rebuild, metrics, on_fatal, self.is_alive
        )

    def _count_retry(self, error: str, spot: Key) -> None:
        self._metrics.forward_errors.labels(self.levels[spot[0]].name, error).inc()

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def request_stop(self) -> None:
        self._stopping.set()
        self.group.wake()

    def stop(self, timeout: float) -> None:
        """Stop after a last commit point; what could not be committed is re-read."""
        self.request_stop()
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    # -- the consumer thread's side --------------------------------------------------
    def handover(self, partitions: set[TP], *, commit: bool) -> dict[TP, int] | None:
        """Let `partitions` go, committed (revoke) or dropped (loss): `Handovers.handover`."""
        return self.handovers.handover(partitions, commit=commit)

    def stalled(self, budget_s: float) -> str | None:
        """Why this forwarder counts as stuck, for readiness; None while it is not: a
        record has been due for longer than `budget_s` (the retry budget) and no commit
        point made anything durable for as long (a producer that cannot reach the
        broker, or a commit that keeps failing). One record failing while others go out
        is not stuck: it is dead-lettered after the same budget. Read from another
        thread: plain attribute reads and the buffer's own lock."""
        clock = self._clock
        idle_s = clock.monotonic() - self.checkpoint.progress_at
        if idle_s <= budget_s:
            return None
        due_of = self.group.due_of
        sent = [due_of(tp, records[0]) for tp, records in list(self.interval.runs) if records]
        held = [ms for ms in (self.group.earliest_held_ms(), self.inbox.set_aside_due_ms) if ms]
        held += sent  # sent and not yet durable: as good as held
        if not held:
            return None
        overdue_s = clock.time() - min(held) / 1000
        if overdue_s <= budget_s:
            return None
        step_s = self.heartbeat.still_s()
        within = f"; one step has lasted {step_s:.0f}s" if step_s > budget_s else ""
        return (
            f"nothing forwarded for {idle_s:.0f}s while records are due "
            f"(the oldest {overdue_s:.0f}s ago){within}"
        )

    def ensure_transaction(self) -> float:
        """A lazy forwarder about to send: `ProducerRebuild.ensure_transaction`."""
        return self.rebuild.ensure_transaction()

    def rebuild_producer(self, failure: ForwarderFatalError) -> None:
        """Replace a producer that failed for good (`ProducerRebuild.rebuild`)."""
        self.rebuild.rebuild(failure)

    # -- the loop ------------------------------------------------------------------
    def _main(self) -> None:
        if self.transactional and not self._lazy:
            try:
                self.checkpoint.txn.init()
            except SendLaterError as exc:  # tried again before the first send
                log.info("%s: %s; trying again before the first send", self.name, exc)
            except ForwarderFatalError as exc:
                if exc.fenced:  # another live instance holds this transactional id
                    self._on_fatal(str(exc))
                    return
                log.warning("%s: %s; the send loop takes it from here", self.name, exc)
        try:
            self._run()
        except ForwarderFatalError as exc:
            self._on_fatal(str(exc))
            return
        failed = raised_by(self.checkpoint.commit_point)
        if isinstance(failed, ForwarderFatalError):
            self._on_fatal(str(failed))
        elif failed is not None:
            log.error("%s: last commit failed; records will be re-read", self.name, exc_info=failed)
        self.handovers.serve()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self.heartbeat.beat()
            raised = raised_by(lambda: self.step(wait=True))
            if isinstance(raised, ForwarderFatalError):
                raise raised
            if isinstance(raised, SendLaterError):  # the transaction coordinator is not there yet
                if self._throttle.allow("later") is not None:
                    log.warning("%s: %s; trying again", self.name, raised)
                self._stopping.wait(0.5)
            elif raised is not None:
                self._m_loop_errors.inc()
                log.error("forwarder %s: unexpected error; continuing", self.name, exc_info=raised)
                self._stopping.wait(0.5)

    def step(self, *, wait: bool = False, commit: bool = False) -> None:
        """One pass of the loop: sleep until something is due (`wait`), send what is due,
        and reach a commit point when one is due (or when `commit`, for tests). A
        producer that failed for good is replaced here (`rebuild_producer`)."""
        raised = raised_by(lambda: self._step(wait=wait, commit=commit))
        if isinstance(raised, ForwarderFatalError):
            self.rebuild_producer(raised)
        elif raised is not None:
            self._step_failed(raised)

    def _step_failed(self, exc: Exception) -> None:
        """A fatal error anywhere in the step replaces the producer; anything else is
        raised again, a lost error as `SendLaterError`."""
        error = fatal_error_in(exc)
        if error is None and lost_client_error(exc):
            # At a fence, while flush served the callbacks: the next call says why.
            # Counted, so that one that keeps coming shows beside the WARNING.
            self._m_loop_errors.inc()
            raise SendLaterError("a producer call lost its error") from exc
        if error is None:
            raise exc
        failure = producer_failed(error, f"{self.name}: {type(exc).__name__}")
        self.rebuild_producer(failure)

    def _step(self, *, wait: bool, commit: bool) -> None:
        clock = self._clock
        interval = self.interval
        checkpoint = self.checkpoint
        self.handovers.serve()
        if wait:
            deadline = checkpoint.next_at()
            until = clock.time() + max(0.0, deadline - clock.monotonic())
            waiting_ms = interval.waiting_until_ms()
            if waiting_ms is not None:
                until = min(until, waiting_ms / 1000)
            self.group.wait(until)
            if self._stopping.is_set():
                return
            self.handovers.serve()
        if self.inbox.reseek_wanted():  # the queues are stale until the consumer thread seeks
            self._stopping.wait(RESEEK_POLL_S)
            return
        if not self._lazy:
            checkpoint.learn()  # with a ledger, what committed before anything is taken
        if interval.waiting:
            self._send_waiting()
        runs = self.group.take(TAKE)
        if runs:
            try:
                self._send_runs(runs)
            finally:
                self.group.settle()
            self.sender.poll(0)
        if self.sender.markers_waiting():
            self._serve_markers()
        if commit or checkpoint.due():
            checkpoint.commit_point()

    # -- sending -------------------------------------------------------------------
    def _send_runs(self, runs: Runs) -> None:
        interval = self.interval
        try:
            self.checkpoint.begin()
        except:  # a bare KafkaError too (kafka.client_errors)
            for tp, records in runs:  # taken, never sent: back where they were
                self.group.put_back(tp, records)
            raise
        for index, (tp, taken) in enumerate(runs):
            interval.took(tp)
            try:
                sent = self.sender.send_run(tp, taken)
            except:  # a bare KafkaError too (kafka.client_errors)
                self._unsent(runs[index:])
                raise
            records = taken
            if sent < len(taken):
                # The rest of this partition waits (metadata unreachable, or a stop while
                # the producer's queue is full); a stop hands back every later run too.
                hold = 0 if self._stopping.is_set() else self._retry_hold_ms()
                interval.put_back(tp, taken[sent:], hold)
                records = taken[:sent]
            if records:
                interval.add(tp, records)
            if sent < len(taken) and self._stopping.is_set():
                for later, rest in runs[index + 1 :]:
                    self.group.put_back(later, rest)
                return

    def _serve_markers(self) -> None:
        """Level mode: answer new markers and move their messages now (in the open
        transaction, exactly-once; `level.markers.actions`)."""
        self.sender.serve_markers(self.checkpoint.begin)

    def _unsent(self, runs: Runs) -> None:
        """A send raised past the sender (a producer gone fatal, or a bug): which records
        of the first run went out is unknown, so it goes back whole with every run after
        it, and nothing it held is lost. Under exactly-once the open transaction may
        hold some of them: it is aborted and the whole interval goes again, so a
        read_committed reader still sees each record once (at-least-once: those that
        went out may arrive twice). A failed abort raises, and the producer is fenced."""
        for tp, records in reversed(runs):
            self.interval.put_back(tp, records)
        self.checkpoint.end_transaction()

    def _retry_hold_ms(self) -> int:
        return int(self._clock.time() * 1000) + self.failures.backoff_ms(1)

    def _send_waiting(self) -> None:
        """At-least-once: send the records set aside whose backoff is over."""
        interval = self.interval
        now_ms = int(self._clock.time() * 1000)
        due = sorted(
            (tp, offset)
            for tp, held in interval.waiting.items()
            for offset, (until, _) in held.items()
            if until <= now_ms
        )
        if not due:
            return
        try:
            for tp, offset in due:
                held = interval.waiting[tp]
                _, record = held[offset]
                if self.sender.send_run(tp, [record]) == 1:
                    del held[offset]
                    interval.add(tp, [record])
                    if not held:
                        del interval.waiting[tp]
                else:
                    held[offset] = (self._retry_hold_ms(), record)
        finally:  # a record still held waits on: what raised did not send it for sure,
            self.checkpoint.waiting_changed()  # and the next pass tries it again
