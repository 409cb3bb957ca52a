"""The consumer thread: the only code that touches a level worker's consumer.

One consumer reads every level topic the worker serves. It polls, appends records to
the per-partition queues under flow control, pauses and resumes partitions, and
(at-least-once) commits the offsets the forwarder reports durable, counting them
committed once the broker confirms. In exactly-once mode it commits nothing itself: it
hands the forwarder its group metadata and the offsets travel in the forwarder's
transactions. Rebalances run their callbacks on this thread too: on revoke the
forwarder first reaches a commit point for the partitions (flush and commit, or commit
the transaction) and lets them go; on loss they are dropped without committing.
librdkafka keeps a partition's pause state across re-assignment, so newly assigned
partitions are resumed explicitly and the paused set is tracked here rather than
trusted to the client.

Backpressure is per partition: a partition is paused near its mark, whatever its
level, so one level's backlog never stops reading of another. The thread waits for the
forwarder only while the hand-over queue is full (`PartitionGroup.handover_full`),
which the forwarder empties at every pass whatever the levels.

Nothing a single record carries may stop this thread: it only appends records (the
forwarder reads their envelopes), and an unexpected exception is logged, counted and
survived, from the first record it had not admitted.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import groupby
from typing import Any, Final

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_LOG_APPEND_TIME,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from delayservice.forward.buffer import TP
from delayservice.forward.forwarder import Forwarder
from delayservice.kafka.broker_clock import BrokerClock
from delayservice.kafka.client_errors import fatal_error_in, raised_by
from delayservice.kafka.client_seam import ConsumerClient
from delayservice.kafka.consumer_keeper import ConsumerKeeper, MakeConsumer, unread_records
from delayservice.kafka.consumer_thread import ConsumerThread
from delayservice.kafka.ready_batch import ready_batch
from delayservice.level.flow_control import FlowControl
from delayservice.level.partition_group import RECORD_KEY_ALLOWANCE, PartitionGroup
from delayservice.levels import Level
from delayservice.metrics.service_metrics import ServiceMetrics

log = logging.getLogger(__name__)

_TOPIC: Final = Message.topic
_PARTITION: Final = Message.partition
_ERROR: Final = Message.error

BATCH = 1000
POLL_TIMEOUT_S = 0.2
LAG_INTERVAL_S = 5.0
PROBE_INTERVAL_S = 2.0
PAUSED_POLL_S = 0.01
HANDOVER_WAIT_S = 0.005
COMMIT_RETRY_S = 1.0
COMMITTED_TIMEOUT_S = 10.0
STABLE_RETRY_S = 0.5
STABLE_WAIT_NOTE_S = 1.0
STABLE_WAIT_WARN_S = 60.0
"""Waiting longer than this for stable offsets (an open transaction is aborted by the
broker within its timeout, 10 s, plus its abort check) is logged as a warning."""

Fallback = Callable[[list[TP]], dict[TP, int] | None]
"""Committed offsets another consumer group holds for these partitions (the other worker
layout's, `layout.OtherLayout`); None while they are not stable yet (a killed member's
transaction still holds them)."""


def tp_of(tp: TopicPartition) -> TP:
    return (tp.topic, tp.partition)


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
        super().__init__(
            f"consumer of {self.name}",
            f"consumer-{self.name}",
            on_fatal,
            loop_errors=metrics.loop_errors.labels(self.name, "consumer"),
            commits=metrics.commits.labels(self.name),
            commit_failures=metrics.commit_failures.labels(self.name),
        )
        self._topics = list(self.levels)
        self._broker_clock = broker_clock if broker_clock is not None else BrokerClock()
        self._fallback = fallback
        self._m_rebuilds = metrics.consumer_rebuilds.labels(self.name)
        self.keeper = ConsumerKeeper(
            self.name,
            make_consumer,
            self.on_error,
            self.on_commit,
            on_fatal,
            self._m_rebuilds.inc,
        )
        self._rejoin_timeout = rejoin_timeout_s
        self.unassigned_since: float | None = None
        """Monotonic time the worker lost its partitions and has not been assigned since."""
        self._stop_timeout = stop_timeout_s
        self._group = group
        self._flow = flow
        self._forwarder = forwarder
        self._exactly_once = forwarder.transactional
        self.owned_partitions: frozenset[TP] = frozenset()
        """Replaced, never changed in place: readiness reads it on the HTTP thread."""
        self.confirmed: dict[TP, int] = {}
        """partition -> the last offset the broker confirmed as committed."""
        self._wanted: dict[TP, int] = {}  # durable offsets not confirmed yet
        self._asked: dict[TP, int] = {}  # of those, asked for and not answered
        self._paused_since: dict[TP, float] = {}
        self._metrics = metrics
        self._m_consumed = {t: metrics.consumed.labels(lv.name) for t, lv in self.levels.items()}
        self._m_clock = metrics.clock_offset.labels(self.name)
        self.paused: set[TP] = set()
        self._rewind: dict[TP, int] = {}
        self._in_hand: list[Message] = []
        """The batch consume() last returned, until every partition of it is admitted."""
        self._admitted: set[TP] = set()
        """Partitions of `_in_hand` whose records were admitted (or set to be re-read)."""
        self._to_resume_on_assign: list[TP] = []
        self.first_assignment = threading.Event()
        """Set once the group has given this instance its first assignment (maybe empty)."""
        self._next_commit = self._next_lag = self._next_probe = 0.0

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
        return dict(self._wanted)

    @property
    def _consumer(self) -> ConsumerClient:
        return self.keeper.client

    def _kept(self) -> ConsumerKeeper:
        return self.keeper

    def on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """Commit results: only what the broker confirmed counts as committed."""
        try:
            self._confirm(error, partitions)
        except Exception:
            log.exception("%s: handling a commit result failed", self.name)

    # -- the loop ------------------------------------------------------------------
    def _subscribe(self) -> None:
        current = self.keeper.current_check()
        self._consumer.subscribe(
            self._topics,
            on_assign=self._guarded(self._assigned, current),
            on_revoke=self._guarded(self._revoked, current),
            on_lost=self._guarded(self._lost, current),
        )

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
        self._let_go(set(self.owned_partitions), commit=False)
        self._to_resume_on_assign.clear()
        self.first_assignment.clear()
        self.unassigned_since = None
        self.paused.clear()
        self._rewind.clear()
        self._subscribe()

    def _recover(self) -> None:
        """Carry on from the first record of the batch in hand that was not admitted."""
        self._rewind_unadmitted()

    def _rewind_unadmitted(self) -> None:
        """The client has moved past every record it returned: a partition of the batch in
        hand not admitted when an iteration raised is read again from its first record
        there (`_apply_rewinds`), never skipped."""
        in_hand, self._in_hand = self._in_hand, []
        first: dict[TP, int] = {}
        for message in in_hand:
            if message.error() is None:
                first.setdefault(
                    (message.topic() or "", message.partition() or 0), message.offset() or 0
                )
        rewind = self._rewind
        for tp, offset in first.items():
            if tp in self._admitted or tp not in self.owned_partitions:
                continue
            rewind[tp] = min(offset, rewind.get(tp, offset))

    def _iteration(self) -> None:
        if self._forwarder.reseek_wanted() and not self._reseek():
            return
        self._in_hand = messages = self._next_messages()
        self._admitted.clear()
        if self._to_resume_on_assign:
            self._resume_fresh()
        if messages:
            self._admit(messages)
        if self._rewind:
            self._apply_rewinds()
        self._resume_drained()
        now = time.monotonic()
        if self._exactly_once:
            self._hand_metadata(self._consumer)
        else:
            durable = self._forwarder.take_durable()
            if durable:
                self._wanted.update(
                    {tp: o for tp, o in durable.items() if tp in self.owned_partitions}
                )
            if self._wanted and (durable or now >= self._next_commit):
                self._commit(asynchronous=True)
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
            self._wanted.update(
                {
                    tp: o
                    for tp, o in self._forwarder.take_durable().items()
                    if tp in self.owned_partitions
                }
            )
            try:
                self._commit(asynchronous=False)
            except KafkaException as exc:
                log.warning("%s: final commit failed (%s); records will be re-read", self.name, exc)
        self._consumer.close()

    # -- admitting records ---------------------------------------------------------
    def _by_partition(self, messages: list[Message]) -> dict[TP, list[Message]]:
        """The batch's records per owned partition, in offset order; errors reported,
        records of a partition about to be sought back skipped (they are read again).

        No Python runs per record: the client returns each partition's records in
        chunks, which `groupby` cuts (by topic, then partition) and `extend` joins, in C."""
        if any(map(_ERROR, messages)):
            messages = self._without_errors(messages)
        runs: dict[TP, list[Message]] = {}
        topics: Iterable[tuple[str, Iterator[Message]]] = groupby(messages, _TOPIC)  # type: ignore[arg-type]
        for topic, of_topic in topics:
            chunks: Iterable[tuple[int, Iterator[Message]]] = groupby(of_topic, _PARTITION)  # type: ignore[arg-type]
            for partition, chunk in chunks:
                tp = (topic, partition)
                run = runs.get(tp)
                if run is None:
                    runs[tp] = list(chunk)
                else:
                    run.extend(chunk)
        rewind, owned = self._rewind, self.owned_partitions
        for tp in [tp for tp in runs if tp in rewind or tp not in owned]:
            run = runs.pop(tp)
            if tp in rewind:
                rewind.setdefault(tp, run[0].offset() or 0)
        return runs

    def _without_errors(self, messages: list[Message]) -> list[Message]:
        """The batch without the client's error events, which are reported."""
        kept = []
        for message in messages:
            error = message.error()
            if error is None:
                kept.append(message)
            elif error.code() != KafkaError._PARTITION_EOF:
                self.on_error(error)
        return kept

    def _admit(self, messages: list[Message]) -> None:
        self._admit_batch(messages)
        self._in_hand = []

    def _admit_batch(self, messages: list[Message]) -> None:
        """Append each partition's records to its queue, as many as flow control admits;
        the first refused record pauses its partition and is read again later."""
        read_ms = int(time.time() * 1000)  # after consume() returned: after every append
        paused, rewind = self.paused, self._rewind
        runs = self._by_partition(messages)
        self.broker_down = self.broker_down and not runs
        group = self._group
        for tp, run in runs.items():
            take = self._flow.admit_many(
                group.counts.get(tp, 0), group.held[tp[0]], run, RECORD_KEY_ALLOWANCE
            )
            refused = take < len(run)
            if refused:
                if tp not in paused:
                    self._pause(tp)
                rewind[tp] = run[take].offset() or 0
                del run[take:]
            if run:
                kind, stamp = run[-1].timestamp()  # the latest append: the tightest bound
                if kind == TIMESTAMP_LOG_APPEND_TIME:
                    self._broker_clock.observe(read_ms, stamp)
                size = sum(map(len, run)) + RECORD_KEY_ALLOWANCE * len(run)
                group.add(tp, run, size, read_ms)
                self._m_consumed[tp[0]].inc(len(run))
            self._admitted.add(tp)
            if not refused:
                self._pause_if_near(tp)

    def _publish_clock_offset(self) -> None:
        """Export the bound on how far this host's clock runs ahead of the broker's that
        the worker's due times are held back by (`BrokerClock`)."""
        bound = self._broker_clock.bound_s
        if bound is not None:
            self._m_clock.set(bound)

    def _pause_if_near(self, tp: TP) -> None:
        """Pause a partition near its mark, before a record is refused: that needs no seek
        back (the client resumes after the last record it delivered). Its own level's
        other partitions and every other level go on being read."""
        if tp not in self.paused and self._group.counts.get(tp, 0) >= self._flow.pause_at:
            self._pause(tp)

    def _pause(self, tp: TP) -> None:
        self._consumer.pause([TopicPartition(*tp)])
        self.paused.add(tp)
        self._paused_since.setdefault(tp, time.monotonic())
        log.debug("%s[%d] paused", *tp)

    def _apply_rewinds(self) -> None:
        """Seek each partition to be read again; one whose seek raises stays to be sought
        next time, and so do the ones after it."""
        rewind = self._rewind
        for tp, offset in list(rewind.items()):
            if tp in self.owned_partitions:
                self._consumer.seek(TopicPartition(tp[0], tp[1], offset))
            del rewind[tp]

    def _resume_drained(self) -> None:
        if not self.paused:
            return
        counts = self._group.counts
        ready = [
            tp
            for tp in self.paused
            if tp not in self.owned_partitions or self._flow.may_resume(counts.get(tp, 0))
        ]
        if not ready:
            return
        live = [tp for tp in ready if tp in self.owned_partitions]
        if live:
            self._consumer.resume([TopicPartition(*tp) for tp in live])
        for tp in ready:
            self.paused.discard(tp)
            self._paused_since.pop(tp, None)

    # -- rebalancing ---------------------------------------------------------------
    def _guarded(
        self,
        callback: Callable[[ConsumerClient, list[TopicPartition]], None],
        current: Callable[[], bool],
    ) -> Callable[[Any, list[TopicPartition]], None]:
        """An exception inside a rebalance callback would surface from consume(); and a
        replaced client's callbacks (while it closes) are ignored."""

        def run(consumer: Any, partitions: list[TopicPartition]) -> None:
            if not current():
                return
            failed = raised_by(lambda: callback(consumer, partitions))  # a bare KafkaError too
            if failed is not None:
                self._m_loop_errors.inc()
                log.error("%s: rebalance callback failed", self.name, exc_info=failed)

        return run

    def _assigned(self, consumer: ConsumerClient, partitions: list[TopicPartition]) -> None:
        start = self._start_offsets(consumer, partitions)
        if start is None:
            return  # stopping: the client's own assignment serves until it closes
        consumer.incremental_assign(start)
        for tp in map(tp_of, partitions):
            self._group.assign(tp)
            self.owned_partitions = self.owned_partitions | {tp}
            self.paused.discard(tp)
            self._rewind.pop(tp, None)
            self._to_resume_on_assign.append(tp)
        self.unassigned_since = None
        self.first_assignment.set()
        log.info("%s: assigned %s", self.name, _named(map(tp_of, partitions)))

    def _try_start(
        self, consumer: ConsumerClient, asked: list[TopicPartition]
    ) -> tuple[list[TopicPartition] | None, str]:
        """One ask of `_start_offsets`: the start, or None and why not yet."""
        committed = consumer.committed(asked, timeout=COMMITTED_TIMEOUT_S)
        failed = [tp for tp in committed if tp.error is not None]
        if failed:
            return None, failed[0].error.str() if failed[0].error is not None else "?"
        start = self._with_fallback(committed)
        if start is None:
            return None, "the other worker layout's group holds unstable offsets"
        return start, ""

    def _ask_start(
        self,
        consumer: ConsumerClient,
        asked: list[TopicPartition],
        into: list[tuple[list[TopicPartition] | None, str]],
    ) -> None:
        into.append(self._try_start(consumer, asked))

    def _start_offsets(
        self, consumer: ConsumerClient, partitions: list[TopicPartition]
    ) -> list[TopicPartition] | None:
        """Where each partition starts, whenever it starts: newly assigned (by a
        rebalance, or to a consumer that replaced a fatal one) or read again (`_reseek`).
        Fetched here and handed to the client explicitly, never left to its own fetch.

        A member killed mid-commit leaves its transaction open, and with it the offsets
        it sent: until the broker aborts it (the transaction timeout), the committed
        offsets of those partitions are unstable, and a read_committed client waits.
        librdkafka's own fetch on assignment could, when a rebalance came in during
        that wait, start such a partition from `auto.offset.reset`, the beginning:
        seen under group churn as a whole partition forwarded again (67 duplicates
        for a read_committed reader). `committed()` waits for the same answer and
        either gives it or times out, so this asks until it answers. A partition the
        other worker layout's group got further in starts there (`fallback`), waiting
        the same way. None: stopping, or the client went fatal (it is replaced at the
        next turn, and its successor's assignment starts by this same rule)."""
        if not partitions:
            return []
        asked = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        since = time.monotonic()
        while True:
            answer: list[tuple[list[TopicPartition] | None, str]] = []
            raised = raised_by(functools.partial(self._ask_start, consumer, asked, answer))
            if answer and answer[0][0] is not None:
                start = answer[0][0]
                break
            reason = answer[0][1] if answer else "?"
            if isinstance(raised, KafkaException):  # a bare KafkaError comes as one too
                reason = str(raised.args[0].str() if raised.args else raised)
                fatal = fatal_error_in(raised)
                if fatal is not None:
                    self.keeper.fail(fatal.str())
                    return None
            elif raised is not None:  # never leave the callback without the assignment
                reason = repr(raised)
                self._m_loop_errors.inc()
                log.error("%s: fetching the start offsets failed", self.name, exc_info=raised)
            if self._stopping.is_set():
                return None
            log.log(
                logging.WARNING if time.monotonic() - since > STABLE_WAIT_WARN_S else logging.INFO,
                "%s: committed offsets of %s not given yet (%s): an open transaction of a "
                "member that stopped mid-commit holds them until the broker ends it; asking again",
                self.name,
                _named(map(tp_of, asked)),
                reason,
            )
            self._stopping.wait(STABLE_RETRY_S)
        waited = time.monotonic() - since
        if waited > STABLE_WAIT_NOTE_S:
            log.info(
                "%s: committed offsets of %s took %.1f s (an open transaction held them)",
                self.name,
                _named(map(tp_of, asked)),
                waited,
            )
        return start

    def _with_fallback(self, committed: list[TopicPartition]) -> list[TopicPartition] | None:
        """Where each partition starts: the later of this group's committed offset and the
        fallback's (offsets only move forward, so the later one is the group that ran
        last); None while the fallback's are not stable."""
        other: dict[TP, int] = {}
        if self._fallback is not None:
            found = self._fallback([tp_of(tp) for tp in committed])
            if found is None:
                return None
            other = found
        out = []
        for tp in committed:
            offset = max(tp.offset, other.get(tp_of(tp), tp.offset))
            if offset != tp.offset:
                log.info(
                    "%s: %s[%d] starts at %d, where the other worker layout got to (%d here)",
                    self.name,
                    tp.topic,
                    tp.partition,
                    offset,
                    tp.offset,
                )
            start = offset if offset >= 0 else OFFSET_BEGINNING
            out.append(TopicPartition(tp.topic, tp.partition, start))
        return out

    def _resume_fresh(self) -> None:
        """Resume what was just assigned: librdkafka keeps a partition's pause across
        re-assignment. Forgotten only once the resume went through: a resume that
        raised was tried again at no later turn, and the partition, paused by flow
        control before it was lost and assigned again, was never read again. A failed
        one waits for the next turn without holding up this one's batch."""
        tps = [
            TopicPartition(*tp)
            for tp in self._to_resume_on_assign
            if tp in self.owned_partitions and tp not in self.paused
        ]
        if tps:
            consumer = self._consumer
            failed = raised_by(lambda: consumer.resume(tps))  # a bare KafkaError too
            if failed is not None:
                self._m_loop_errors.inc()
                log.warning(
                    "%s: resuming %s failed (%s); trying again at the next turn",
                    self.name,
                    _named(map(tp_of, tps)),
                    failed,
                )
                return
        self._to_resume_on_assign.clear()

    def _revoked(self, consumer: ConsumerClient, partitions: list[TopicPartition]) -> None:
        gone = {tp_of(tp) for tp in partitions}
        if self._exactly_once:
            self._hand_metadata(consumer)
        durable = self._let_go(gone, commit=True)
        safe = [
            TopicPartition(tp[0], tp[1], o)
            for tp, o in (durable or {}).items()
            if self.confirmed.get(tp) != o
        ]
        if safe and not self._exactly_once:
            try:
                results = consumer.commit(offsets=safe, asynchronous=False)
                self._count_commit(None, results)
            except KafkaException as exc:
                self._m_commit_failures.inc()
                log.warning(
                    "%s: commit on revoke failed (%s); records will be re-read", self.name, exc
                )
        for tp in gone:
            self.confirmed.pop(tp, None)
        log.info("%s: revoked %s", self.name, _named(gone))

    def _lost(self, _consumer: ConsumerClient, partitions: list[TopicPartition]) -> None:
        gone = {tp_of(tp) for tp in partitions}
        self._let_go(gone, commit=False)
        for tp in gone:
            self.confirmed.pop(tp, None)
        if not self.owned_partitions and self.unassigned_since is None:
            self.unassigned_since = time.monotonic()
        log.warning("%s: lost %s", self.name, _named(gone))

    def _hand_metadata(self, consumer: ConsumerClient) -> None:
        """Give the forwarder the group metadata its transactions commit offsets with;
        while the client has none (closing, between generations) it keeps the last."""
        try:
            self._forwarder.group_metadata = consumer.consumer_group_metadata()
        except (RuntimeError, KafkaException) as exc:
            log.debug("%s: no group metadata now: %s", self.name, exc)

    def _let_go(self, gone: set[TP], *, commit: bool) -> dict[TP, int] | None:
        """The forwarder commits (or drops) what it holds of `gone`, then they are
        forgotten here too; returns what it made durable for them (at-least-once)."""
        durable = self._forwarder.handover(gone, commit=commit)
        self._group.drop(gone)
        self.owned_partitions = self.owned_partitions - gone
        self.paused -= gone
        for tp in gone:
            self._rewind.pop(tp, None)
            self._paused_since.pop(tp, None)
            self._wanted.pop(tp, None)
            self._asked.pop(tp, None)
        # A hand-over that ended in an unknown outcome leaves a re-seek asked for. It is
        # done by the next iteration, never here: in a rebalance callback a committed()
        # or seek() waiting on a frozen broker would hold the rebalance with it.
        return durable

    def _reseek(self) -> bool:
        """The forwarder dropped what it held (an unknown transaction outcome, a group
        error): every owned partition's queue is emptied and the partition is read again
        from where an assignment would start it (`_start_offsets`: its committed offset,
        which says what that transaction did, or the other worker layout's when that is
        later; a partition idle since a change of layout has no commit in this group).
        Done here, on the one thread that admits records, so nothing read before the
        seek is queued after it. False: not done (stopping, or the client went fatal),
        the request left in place and nothing read until it is."""
        owned = sorted(self.owned_partitions)
        if owned:
            start = self._start_offsets(self._consumer, [TopicPartition(*tp) for tp in owned])
            if start is None:
                return False
            self._group.drop(set(owned))
            for tp in start:
                self._group.assign(tp_of(tp))
                self._rewind.pop(tp_of(tp), None)
                self._consumer.seek(tp)
            log.info(
                "%s: reading %s again from their start offsets",
                self.name,
                ", ".join(f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in start),
            )
        self._forwarder.reseek_done()
        return True

    # -- commits and gauges --------------------------------------------------------
    def _commit(self, *, asynchronous: bool) -> None:
        """Ask the broker to commit what the forwarder made durable; an offset counts as
        committed only once the broker confirms it, and is asked for again otherwise."""
        wanted = {tp: o for tp, o in self._wanted.items() if self.confirmed.get(tp) != o}
        self._wanted = wanted
        ask = {
            tp: o for tp, o in wanted.items() if asynchronous is False or self._asked.get(tp) != o
        }
        if not ask:
            return
        offsets = [TopicPartition(tp[0], tp[1], o) for tp, o in ask.items()]
        if asynchronous:
            self._asked.update(ask)
            self._consumer.commit(offsets=offsets, asynchronous=True)
        else:
            self._confirm(None, self._consumer.commit(offsets=offsets, asynchronous=False))

    def _confirm(self, error: KafkaError | None, partitions: list[TopicPartition] | None) -> None:
        if error is not None and error.code() == KafkaError._NO_OFFSET:
            return  # nothing was asked for
        self._count_commit(error, partitions)

    def _count_commit(
        self, error: KafkaError | None, partitions: list[TopicPartition] | None
    ) -> None:
        done, failed = self._answered(error, partitions)
        if error is not None:
            self._asked.clear()
            return
        for tp, offset in ((tp_of(tp), tp.offset) for tp in done if tp.topic in self.levels):
            self.confirmed[tp] = offset
            self._asked.pop(tp, None)
            if self._wanted.get(tp) == offset:
                del self._wanted[tp]
        for failure in failed:
            self._asked.pop(tp_of(failure), None)

    def _update_gauges(self, *, lag: bool) -> None:
        group = self._group
        metrics = self._metrics
        now_s = self._broker_clock.time()
        now = time.monotonic()
        set_aside = self._forwarder.set_aside_due_by_topic
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
                max((now - self._paused_since.get(tp, now) for tp in paused), default=0.0)
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


def _named(tps: Iterable[TP]) -> str:
    """Partitions as `topic[0,2]`, for log lines."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in tps:
        by_topic.setdefault(topic, []).append(partition)
    return (
        ", ".join(f"{topic}{sorted(partitions)}" for topic, partitions in sorted(by_topic.items()))
        or "[]"
    )
