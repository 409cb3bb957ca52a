"""A forwarder's commit state, and the commit points that end it.

The forwarder sends; what that sending may commit is decided here, in one place, so
that no path between the two threads and the client's errors can commit a record that
was not made durable, or lose one that was. The checkpoint owns the open interval (what
was taken and sent since the last commit point, and the records set aside for a
retry), the transaction (exactly-once) or the offsets made durable for the consumer
thread to commit (at-least-once), the ledger a precise forwarder's transactions carry
instead of offsets, and the re-read the consumer thread is asked for when an outcome
is unknown. Kafka Streams spreads the same over `TaskManager.commit`,
`StreamsProducer` and `RecordCollector`; quix-streams keeps one `Checkpoint`.

At each commit point the interval is made durable and each partition's committable
offset moves to the one after the last record sent:

- at-least-once: flush the producer; the offsets go to the consumer thread, which
  commits them (the consumer is that thread's alone);
- exactly-once: the records went inside a transaction; the offsets join it with
  `send_offsets_to_transaction` (the consumer thread hands over its group metadata)
  and the transaction commits. One thread owns the producer, so nothing is produced
  while a commit is in flight.

Precise mode hands each commit point's durable records to `settle`, which settles them
in their slots (`precise.settle.settle_durable`). Exactly-once, its transactions carry
no consumer offsets but a `ledger`'s record of what they delivered
(`transaction_ledger`), learned again after every init_transactions; an unknown outcome
then puts the interval back in the buffer, where what the ledger says committed is
settled unsent.

Owned by the forwarder thread. What it tells the consumer thread (offsets made durable,
a re-read) goes through the worker's `Inbox`.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException

from delayservice.forward import dead_letter as dl
from delayservice.forward.buffer import TP, Buffer, Runs
from delayservice.forward.failures import UNKNOWN_TARGET, Failures, Key
from delayservice.forward.inbox import Inbox
from delayservice.forward.open_interval import OpenInterval
from delayservice.forward.send_errors import FENCED, producer_failed
from delayservice.forward.sender import RecordSender
from delayservice.forward.transaction import Transaction
from delayservice.forward.transaction_ledger import TransactionLedger
from delayservice.kafka.client_errors import error_of, is_fatal
from delayservice.kafka.unconfirmed_acks import UnconfirmedAcks
from delayservice.levels import Level
from delayservice.log_throttle import Throttle
from delayservice.metrics.service_metrics import COMMIT_STEPS, ServiceMetrics

log = logging.getLogger(__name__)

UNCONFIRMED: Final = "unconfirmed_ack"
GROUP_ERRORS: Final = frozenset(
    {
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError.REBALANCE_IN_PROGRESS,
    }
)
"""The group moved on under the transaction: what it held may no longer be this
member's to send, so nothing of it is sent again from memory (see `reset`)."""


def commit_floor(interval_s: float) -> float:
    """How soon after the last commit a forwarder that has sent everything due may
    commit again: a fifth of the interval, within 10 to 200 ms. Committing once caught
    up shortens what read_committed readers wait (exactly-once: at a steady rate they
    would otherwise wait for the whole interval, since some record is always about to
    fall due) and what is re-read after a crash. Nothing is due when it starts, but
    what falls due during the commit waits for it (exactly-once at 10,000 msg/s over
    three levels: most of the forwarder's time; docs/performance.md); the floor keeps
    a trickle of records from turning into a commit per record (each commit is a flush
    and one or two round trips). A backlog commits at the interval."""
    return min(0.2, max(0.01, interval_s / 5))


class Checkpoint:
    def __init__(
        self,
        name: str,
        levels: Mapping[str, Level],
        group: Buffer,
        interval: OpenInterval,
        sender: RecordSender,
        failures: Failures,
        metrics: ServiceMetrics,
        stopping: threading.Event,
        clock: Any,
        *,
        producer: Any,
        transactional: bool,
        unconfirmed: UnconfirmedAcks,
        commit_interval_s: float,
        flush_timeout_s: float,
        settle: Callable[[Runs], None] | None,
        ledger: TransactionLedger | None,
        inbox: Inbox,
    ) -> None:
        """`interval` is what `sender` writes its notes into as it sends; `producer` is
        the one `sender` sends through (`Transaction.replace` follows it). `settle`,
        `ledger`: as `Forwarder` takes them."""
        self.name = name
        self.levels = levels
        self.group = group
        self.interval = interval
        self.transactional = transactional
        self._sender = sender
        self._failures = failures
        self._clock = clock
        self._unconfirmed = unconfirmed
        self._interval_s = commit_interval_s
        self._floor_s = commit_floor(commit_interval_s)
        self._flush_timeout = flush_timeout_s
        self._settle = settle
        self._ledger = ledger
        self._metrics = metrics
        self._m_forwarded = {t: metrics.forwarded.labels(lv.name) for t, lv in levels.items()}
        self._m_stubs = {t: metrics.dead_letter_stubs.labels(lv.name) for t, lv in levels.items()}
        for level in levels.values():
            metrics.lateness.labels(level.name)
            for reason in dl.REASONS:
                metrics.dead_lettered.labels(level.name, reason)
        self._m_commits = metrics.commits.labels(name)
        self._m_commit_failures = metrics.commit_failures.labels(name)
        self._m_steps = {
            step: metrics.commit_step_seconds.labels(name, step) for step in COMMIT_STEPS
        }
        self.txn = Transaction(
            name,
            producer,
            stopping,
            clock,
            self._step_spent,
            ledger.learn if ledger is not None else None,
            lambda: inbox.group_metadata,
        )
        # progress_at: when a commit point last made records durable (`Forwarder.stalled`).
        self._last_commit = self.progress_at = clock.monotonic()
        self._throttle = Throttle()
        self.inbox = inbox

    # -- when ----------------------------------------------------------------------
    def next_at(self) -> float:
        """The monotonic time from which a caught-up forwarder may commit (`due`),
        or never while nothing waits to commit."""
        busy = self.interval or self.ledger_pending()
        return self._last_commit + self._floor_s if busy else float("inf")

    def due(self) -> bool:
        """Whether a commit point is due: something waits to commit (an open
        transaction with nothing in it too: one turned abortable before anything was
        sent refuses every produce() until it is aborted), and the interval is over, a
        delivery failed, or the floor is over with nothing due."""
        interval = self.interval
        since = self._clock.monotonic() - self._last_commit
        return bool(
            (interval or self.ledger_pending() or self.txn.open)
            and (
                since >= self._interval_s
                or interval.reports
                or (since >= self._floor_s and self._idle())
            )
        )

    def ledger_pending(self) -> bool:
        return self._ledger is not None and self._ledger.pending()

    def _idle(self) -> bool:
        head = self.group.next_due_ms()
        return head is None or head > self._clock.time() * 1000

    # -- the transaction -----------------------------------------------------------
    def learn(self) -> None:
        """With a ledger: learn what committed before anything is taken (once per
        producer, after its init_transactions)."""
        if self._ledger is not None:
            self.txn.init()

    def begin(self) -> None:
        """Exactly-once: open a transaction for what is sent next, unless one is open."""
        if self.transactional and not self.txn.open:
            self.txn.begin()

    def end_transaction(self) -> None:
        """Abort the open transaction (its records go again from the queues); raises
        `ForwarderFatalError` when even that fails (the producer is then fenced)."""
        if self.transactional and self.txn.open:
            self.txn.abort()
            self.interval.requeue({})

    # -- commit points -------------------------------------------------------------
    def commit_point(self) -> bool:
        """Make the interval durable and move the committable offsets; False when it
        could not (it is tried again, or sent again, from the same offsets)."""
        interval = self.interval
        self._last_commit = self._clock.monotonic()
        if not interval and not self.txn.open:
            if not self.ledger_pending():
                return True
            self.txn.begin()
        remaining = self._sender.flush(self._flush_timeout)
        self._step_spent("flush", self._clock.monotonic() - self._last_commit)
        if remaining:
            self._m_commit_failures.inc()
            log.warning(
                "%s: %d forwards unacknowledged after %.0fs; not committing yet",
                self.name,
                remaining,
                self._flush_timeout,
            )
            if self.transactional:
                self.txn.abort()
                interval.requeue({})
            return False
        self._sender.poll(0)  # log lines queued behind the last report
        if self._resent_unconfirmed():
            return False
        if interval.reports:
            again, backoff_ms = self._place_reports()
            if self.transactional:
                self.txn.abort()
                interval.requeue(self._holds(again, backoff_ms))
                return False
            interval.set_aside(
                again, self._failures.failing, int(self._clock.time() * 1000), backoff_ms
            )
            self.waiting_changed()
        offsets = interval.committable()
        if self._ledger is not None:
            if not (self._ledger_written() and self._commit_transaction({})):
                return False
            self._ledger.committed()
        elif self.transactional:
            offsets = interval.fenced(offsets)
            if not self._commit_transaction(offsets):
                return False
        else:
            self.inbox.made_durable(offsets)
        self._settled(offsets)
        return True

    def _step_spent(self, step: str, seconds: float) -> None:
        self._m_steps[step].observe(seconds)

    def _resent_unconfirmed(self) -> bool:
        """When librdkafka inferred a success in this interval, nothing of it commits:
        everything goes again (exactly-once: after an abort, so readers see it once)."""
        inferred, line = self._unconfirmed.take()
        if not inferred:
            return False
        interval = self.interval
        by_topic = Counter[str]()
        for tp, records in interval.runs:
            by_topic[tp[0]] += len(records)
        for topic, count in by_topic.items():
            self._metrics.forward_errors.labels(self.levels[topic].name, UNCONFIRMED).inc(count)
        held_back = self._throttle.allow(UNCONFIRMED)
        if held_back is not None:
            log.warning(
                "%s: librdkafka inferred a delivery the broker did not confirm (%s); "
                "sending the %d records since the last commit again%s",
                self.name,
                line,
                by_topic.total(),
                f" ({held_back} more times since the last line)" if held_back else "",
            )
        interval.reports.clear()
        if self.transactional:
            self.txn.abort()
        interval.requeue({})
        return True

    def _settled(self, offsets: dict[TP, int]) -> None:
        """The interval is durable and `offsets` committed: count it, and start anew."""
        self.progress_at = self._clock.monotonic()
        interval = self.interval
        forwarded = Counter[str]()
        for doom_spot, doom in interval.dead_sent.items():
            forwarded[doom_spot[0]] -= 1
            self._metrics.dead_lettered.labels(self.levels[doom_spot[0]].name, doom.reason).inc()
            if doom.stub:
                self._m_stubs[doom_spot[0]].inc()
        for spot in (*interval.rerouted, *interval.withdrawn):
            forwarded[spot[0]] -= 1
        lateness = interval.take_lateness()
        runs = interval.settle(offsets)
        if self._settle is not None and runs:
            self._settle(runs)
        for tp, records in runs:
            forwarded[tp[0]] += len(records)
        self._failures.committed(runs)
        self.group.retire(runs)
        for topic, count in forwarded.items():
            if count > 0:
                self._m_forwarded[topic].inc(count)
        for topic, pairs in lateness.items():
            if pairs:
                self._metrics.lateness.observe_counted(
                    self.levels[topic].name, [(max(0, ms) / 1000, n) for ms, n in pairs]
                )
        self._m_commits.inc()

    def _ledger_written(self) -> bool:
        """The delivery record goes into the transaction. One the broker made abortable
        meanwhile (its coordinator's timeout, after a stall) refuses it with `_STATE`:
        raised past the commit point, no abort ever came and the interval stayed unsent
        for good. It is aborted and sent again, as a failed commit is."""
        assert self._ledger is not None
        try:
            self._ledger.write(self.txn.producer, self.interval.runs)
        except KafkaException as exc:
            error = error_of(exc)
            if not self.transactional or error is None or error.code() != KafkaError._STATE:
                raise
            self._m_commit_failures.inc()
            log.warning(
                "%s: the transaction was refused its delivery record (%s); sending it again",
                self.name,
                error.str(),
            )
            self.end_transaction()
            return False
        return True

    def _commit_transaction(self, offsets: dict[TP, int]) -> bool:
        try:
            self.txn.commit(offsets)
            return True
        except KafkaException as exc:
            error = error_of(exc)
            self._m_commit_failures.inc()
            if error is not None and (is_fatal(error) or error.code() in FENCED):
                raise producer_failed(error, f"{self.name}: commit_transaction") from exc
            group_moved = error is not None and error.code() in GROUP_ERRORS
            log.warning(
                "%s: transaction could not commit (%s); %s",
                self.name,
                error.str() if error is not None else exc,
                "reading again from the committed offsets" if group_moved else "sending it again",
            )
            if group_moved:
                self.txn.abort()
                self.reset()
            else:
                self.end_transaction()
            return False

    def _place_reports(self) -> tuple[set[Key], int]:
        interval = self.interval
        reports, interval.reports = interval.reports, []
        for error, report, _ in reports:
            if error.code() in UNKNOWN_TARGET and report.topic():
                self._sender.forget_target(report.topic() or "")
        return self._failures.place(reports, interval.runs, interval.rerouted, interval.dead_sent)

    def _holds(self, again: set[Key], backoff_ms: int) -> dict[TP, int]:
        """Partitions to hold back, until when (epoch ms): those with a record retried."""
        if not backoff_ms:
            return {}
        until = int(self._clock.time() * 1000) + backoff_ms
        failing = self._failures.failing
        return {(spot[0], spot[1]): until for spot in again if spot in failing}

    # -- when the interval cannot commit -------------------------------------------
    def reset(self) -> None:
        """After an unknown outcome or a group error, as Kafka Streams does: nothing held
        in memory is sent again. The interval and the queues are dropped and the
        consumer thread seeks every owned partition back to its committed offset, which
        says what the transaction did; until then nothing is taken. With a `ledger` the
        interval goes back to the buffer instead: the ledger, learned again after the
        fence, says which of its records committed."""
        if self._ledger is not None:
            self.interval.requeue({})
            self.waiting_changed()
            return
        self.inbox.ask_reseek()
        self.interval.reset()
        self.waiting_changed()

    def producer_lost(self) -> None:
        """The producer failed for good and is being replaced: everything sent since the
        last commit goes again (exactly-once, its transaction's outcome is unknown:
        nothing from memory, `reset`)."""
        self.interval.reports.clear()
        self._unconfirmed.take()  # the interval goes again anyway
        if self.transactional:
            self.reset()
        else:
            self.interval.requeue({})

    def abandon(self, tps: set[TP]) -> None:
        """Lost partitions: nothing of theirs may commit. In exactly-once the open
        transaction holds their records, so it is aborted and the others go again."""
        if self.transactional and self.txn.open:
            self.txn.abort()
            self.interval.requeue({})
        else:
            self.interval.drop(tps)

    def forget(self, tps: set[TP]) -> None:
        """`tps` are no longer this worker's: every trace of them goes."""
        self.group.drop(tps)
        self._failures.forget(tps)
        self.interval.forget(tps)
        self.waiting_changed()
        self.inbox.forget(tps)

    # -- the retry holds -----------------------------------------------------------
    def waiting_changed(self) -> None:
        """The records set aside changed: their earliest due times, for the gauges."""
        by_topic: dict[str, int] = {}
        for tp, held in self.interval.waiting.items():
            for _, record in held.values():
                due = self.group.due_of(tp, record)
                if due < by_topic.get(tp[0], due + 1):
                    by_topic[tp[0]] = due
        self.inbox.set_aside(by_topic)
