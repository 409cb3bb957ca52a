"""The consumer thread: the only code that touches a level worker's consumer.

One consumer reads every level topic the worker serves. It polls, appends records to
the per-partition queues under flow control (`RecordAdmission`), pauses and resumes
partitions, and (at-least-once) commits the offsets the forwarder reports durable,
counting them committed once the broker confirms (`OffsetCommits`). In exactly-once
mode it commits nothing itself: it hands the forwarder its group metadata and the
offsets travel in the forwarder's transactions. Rebalances run their callbacks on this
thread too (`Rebalances`), and every partition starts where `StartOffsets` says, on
assignment and when the forwarder asks for everything owned to be read again.

The thread waits for the forwarder only while the hand-over queue is full
(`PartitionGroup.handover_full`), which the forwarder empties at every pass whatever
the levels.

Nothing a single record carries may stop this thread: an unexpected exception is
logged, counted and survived, from the first record it had not admitted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from delayservice.forward.buffer import TP
from delayservice.forward.forwarder import Forwarder
from delayservice.kafka.broker_clock import BrokerClock
from delayservice.kafka.client_seam import ConsumerClient
from delayservice.kafka.consumer_keeper import ConsumerKeeper, MakeConsumer, unread_records
from delayservice.kafka.consumer_thread import ConsumerThread
from delayservice.kafka.ready_batch import ready_batch
from delayservice.level.flow_control import FlowControl
from delayservice.level.offset_commits import OffsetCommits
from delayservice.level.partition_group import PartitionGroup
from delayservice.level.reading_state import ReadingState
from delayservice.level.rebalance_callbacks import Rebalances
from delayservice.level.record_admission import RecordAdmission
from delayservice.level.start_offsets import Fallback, StartOffsets
from delayservice.levels import Level
from delayservice.metrics.service_metrics import ServiceMetrics

log = logging.getLogger(__name__)

BATCH = 1000
POLL_TIMEOUT_S = 0.2
LAG_INTERVAL_S = 5.0
PROBE_INTERVAL_S = 2.0
PAUSED_POLL_S = 0.01
HANDOVER_WAIT_S = 0.005
COMMIT_RETRY_S = 1.0


class ConsumerLoop(ConsumerThread):
    def __init__(
        self,
        levels: Sequence[Level],
        make_consumer: MakeConsumer,
        group: PartitionGroup,
        flow: FlowControl,
        forwarder: Forwarder,
        metrics: ServiceMetrics,
        on_fatal: Callable[[str], None],
        rejoin_timeout_s: float = 30.0,
        stop_timeout_s: float = 20.0,
        broker_clock: BrokerClock | None = None,
        *,
        name: str | None = None,
        fallback: Fallback | None = None,
    ) -> None:
        """`levels`: the level topics it reads; `name`: its worker's (the per-worker
        metrics, the thread). `rejoin_timeout_s`: how long it may go without an
        assignment after losing its partitions before its consumer is taken as wedged
        and replaced. `broker_clock`: the clock due times are met by, told how long each
        record took to read (one per process; its own when not given). `fallback`:
        where a partition with no committed offset in this group starts instead."""
        self.levels = {level.topic: level for level in levels}
        self.name = name if name is not None else "+".join(lv.name for lv in levels)
        loop_errors = metrics.loop_errors.labels(self.name, "consumer")
        commit_failures = metrics.commit_failures.labels(self.name)
        super().__init__(
            f"consumer of {self.name}",
            f"consumer-{self.name}",
            on_fatal,
            loop_errors=loop_errors,
            commits=metrics.commits.labels(self.name),
            commit_failures=commit_failures,
        )
        self._topics = list(self.levels)
        self._broker_clock = broker_clock if broker_clock is not None else BrokerClock()
        self._fallback = fallback
        self._m_rebuilds = metrics.consumer_rebuilds.labels(self.name)
        self._reading = ReadingState()
        self._commits = OffsetCommits(self.name, self.levels, self._answered, commit_failures)
        self.keeper = ConsumerKeeper(
            self.name,
            make_consumer,
            self.on_error,
            self.on_commit,
            on_fatal,
            self._m_rebuilds.inc,
        )
        self._rejoin_timeout = rejoin_timeout_s
        self._stop_timeout = stop_timeout_s
        self._group = group
        self._forwarder = forwarder
        self._exactly_once = forwarder.transactional
        self._metrics = metrics
        self._m_clock = metrics.clock_offset.labels(self.name)
        self._admission = RecordAdmission(
            self.name,
            self.keeper,
            self._reading,
            group,
            flow,
            self._broker_clock,
            {t: metrics.consumed.labels(lv.name) for t, lv in self.levels.items()},
            on_error=self.on_error,
            on_records=self._broker_answered,
            loop_errors=loop_errors,
        )
        self._starts = StartOffsets(
            self.name, self.keeper, self._stopping, loop_errors, self._reading, group, forwarder
        )
        self._rebalances = Rebalances(
            self.name,
            self._reading,
            group,
            forwarder,
            self._commits,
            self._starts,
            lambda: self._fallback,
            loop_errors,
        )
        self._next_commit = self._next_lag = self._next_probe = 0.0

    # -- what its worker and readiness read ------------------------------------------
    @property
    def owned_partitions(self) -> frozenset[TP]:
        """Replaced, never changed in place: readiness reads it on the HTTP thread."""
        return self._reading.owned

    @owned_partitions.setter
    def owned_partitions(self, owned: frozenset[TP]) -> None:
        self._reading.owned = owned

    @property
    def paused(self) -> set[TP]:
        return self._reading.paused

    @property
    def first_assignment(self) -> threading.Event:
        """Set once the group has given this instance its first assignment (maybe empty)."""
        return self._reading.first_assignment

    @property
    def unassigned_since(self) -> float | None:
        """Monotonic time the worker lost its partitions and has not been assigned since."""
        return self._reading.unassigned_since

    @property
    def confirmed(self) -> dict[TP, int]:
        """partition -> the last offset the broker confirmed as committed."""
        return self._commits.confirmed

    # -- lifecycle -----------------------------------------------------------------
    def request_stop(self) -> None:
        super().request_stop()
        self._forwarder.request_stop()

    def owned(self, topic: str | None = None) -> list[int]:
        """The partitions it owns (of `topic`, or of its only level)."""
        topic = topic if topic is not None else self._topics[0]
        return sorted(p for t, p in self.owned_partitions if t == topic)

    def uncommitted(self) -> dict[TP, int]:
        """Offsets made durable but not yet confirmed committed (at-least-once)."""
        return self._commits.uncommitted()

    @property
    def _consumer(self) -> ConsumerClient:
        return self.keeper.client

    def _kept(self) -> ConsumerKeeper:
        return self.keeper

    def on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """Commit results: only what the broker confirmed counts as committed."""
        try:
            self._commits.confirm(error, partitions)
        except Exception:
            log.exception("%s: handling a commit result failed", self.name)

    # -- the loop ------------------------------------------------------------------
    def _subscribe(self) -> None:
        current = self.keeper.current_check()
        self._rebalances.subscribe(self._consumer, self._topics, current)

    def _open(self) -> ConsumerKeeper:
        self._next_commit = self._next_lag = self._next_probe = time.monotonic()
        self._subscribe()
        return self.keeper

    _replace_hint = "; if it is fenced, another live process uses the same instance_name"

    def _replaced(self) -> None:
        """The consumer that hit a fatal error was replaced (repeated fencing means
        another live process uses this instance name, which only an operator can fix).

        What it held is dropped uncommitted, as on a lost assignment: the new consumer
        re-reads from the last confirmed commit, so nothing is lost (some records may
        be forwarded twice).
        """
        self._rebalances.let_go(set(self.owned_partitions), commit=False)
        self._reading.restart()
        self._subscribe()

    def _recover(self) -> None:
        """Carry on from the first record of the batch in hand that was not admitted."""
        self._admission.rewind_unadmitted()

    def _broker_answered(self) -> None:
        """A read returned records: the broker is reachable."""
        self.broker_down = False

    def _iteration(self) -> None:
        if self._forwarder.inbox.reseek_wanted() and not self._starts.reseek(self._fallback):
            return
        self._admission.admit_turn(self._next_messages())
        now = time.monotonic()
        if self._exactly_once:
            self._rebalances.hand_metadata(self._consumer)
        else:
            commits = self._commits
            durable = self._forwarder.inbox.take_durable()
            if durable:
                commits.want(durable, self.owned_partitions)
            if commits.wanting() and (durable or now >= self._next_commit):
                commits.commit(self._consumer, asynchronous=True)
                self._next_commit = now + COMMIT_RETRY_S
        self._update_gauges(lag=now >= self._next_lag)
        if now >= self._next_lag:
            self._next_lag = now + LAG_INTERVAL_S
            self._publish_clock_offset()
        if (
            self.unassigned_since is not None
            and now - self.unassigned_since > self._rejoin_timeout
            and not self.broker_down
        ):
            self.keeper.fail(
                f"no assignment {now - self.unassigned_since:.0f}s after losing its "
                "partitions while the broker answers"
            )
        if self.broker_down and now >= self._next_probe:
            self._probe_broker()
            self._next_probe = now + PROBE_INTERVAL_S

    def _next_messages(self) -> list[Message]:
        """The next batch, without waiting for a full one.

        consume(n, t) waits for n records or t; take what is queued at once and block
        only for the first record, so a partly fetchable backlog (paused partitions)
        never waits out the timeout per batch.
        """
        if self._group.handover_full():
            self._group.wait_drained(HANDOVER_WAIT_S)
            return []
        # A paused partition resumes only between two calls: wait briefly, or the
        # forwarder drains it and then waits for this thread (up to the timeout, per
        # pause; forwarding ran at a third of the bare pipe under a backlog).
        wait = PAUSED_POLL_S if self.paused else POLL_TIMEOUT_S
        return ready_batch(self._consumer, BATCH, wait)

    def _shutdown(self) -> None:
        """Runs after the loop: the forwarder's last commit point, then the last commit,
        then leave the group."""
        self._forwarder.stop(timeout=self._stop_timeout)
        if not self._exactly_once:
            self._commits.want(self._forwarder.inbox.take_durable(), self.owned_partitions)
            try:
                self._commits.commit(self._consumer, asynchronous=False)
            except KafkaException as exc:
                log.warning("%s: final commit failed (%s); records will be re-read", self.name, exc)
        self._consumer.close()

    # -- gauges --------------------------------------------------------------------
    def _publish_clock_offset(self) -> None:
        """Export the bound on how far this host's clock runs ahead of the broker's that
        the worker's due times are held back by (`BrokerClock`)."""
        bound = self._broker_clock.bound_s
        if bound is not None:
            self._m_clock.set(bound)

    def _update_gauges(self, *, lag: bool) -> None:
        group = self._group
        metrics = self._metrics
        now_s = self._broker_clock.time()
        now = time.monotonic()
        set_aside = self._forwarder.inbox.set_aside_due_by_topic
        for topic, level in self.levels.items():
            name = level.name
            metrics.buffered_messages.labels(name).set(group.held.get(topic, 0))
            metrics.buffered_bytes.labels(name).set(group.held_bytes.get(topic, 0))
            held = (group.earliest_held_ms(topic), set_aside.get(topic))
            head_ms = min((ms for ms in held if ms is not None), default=None)
            metrics.next_due.labels(name).set(head_ms / 1000 if head_ms is not None else 0.0)
            metrics.oldest_overdue.labels(name).set(
                max(0.0, now_s - head_ms / 1000) if head_ms is not None else 0.0
            )
            paused = [tp for tp in self.paused if tp[0] == topic]
            metrics.paused_partitions.labels(name).set(len(paused))
            metrics.longest_pause.labels(name).set(
                max((now - self._reading.paused_since.get(tp, now) for tp in paused), default=0.0)
            )
            owned = [p for t, p in self.owned_partitions if t == topic]
            metrics.assigned_partitions.labels(name).set(len(owned))
            if lag:
                metrics.consumer_lag.labels(name).set(
                    unread_records(self._consumer, topic, sorted(owned))
                )

    def _probe_broker(self) -> None:
        try:
            self._consumer.list_topics(self._topics[0], timeout=1.0)
        except KafkaException:
            return
        self.broker_down = False
        log.info("%s: broker reachable again", self.name)
