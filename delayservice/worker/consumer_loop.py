"""The consumer thread: the only code that touches the level's consumer.

It polls, admits records into the buffer under flow control, pauses and resumes
partitions, serves the producer's delivery reports, and commits the offsets the
ledger says are safe. Rebalances run their callbacks on this thread too: on revoke
it drops the partitions' buffered records and commits what is safe; on loss it drops
them without committing. librdkafka keeps a partition's pause state across
re-assignment, so newly assigned partitions are resumed explicitly and the paused set
is tracked here rather than trusted to the client.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from delayservice.envelope import unwrap
from delayservice.errors import EnvelopeError
from delayservice.levels import Level
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.timers.base import Scheduler
from delayservice.worker import dead_letter as dl
from delayservice.worker.flow_control import FlowControl
from delayservice.worker.forwarder import Forwarder
from delayservice.worker.ledger import LevelLedger
from delayservice.worker.record import HeldRecord, record_size

log = logging.getLogger(__name__)

BATCH = 500
POLL_TIMEOUT_S = 0.2
LAG_INTERVAL_S = 5.0
PROBE_INTERVAL_S = 2.0


class ConsumerLoop:
    def __init__(
        self,
        level: Level,
        make_consumer: Callable[[Callable[[KafkaError], None]], Consumer],
        producer: Any,
        scheduler: Scheduler[HeldRecord],
        ledger: LevelLedger,
        flow: FlowControl,
        forwarder: Forwarder,
        metrics: ServiceMetrics,
        commit_interval_s: float,
        flush_timeout_s: float,
        on_fatal: Callable[[str], None],
    ) -> None:
        self.level = level
        self._consumer = make_consumer(self.on_error)
        self._flush_timeout = flush_timeout_s
        self._producer = producer
        self._scheduler = scheduler
        self._ledger = ledger
        self._flow = flow
        self._forwarder = forwarder
        self._commit_interval = commit_interval_s
        self._on_fatal = on_fatal
        name = level.name
        self._m_consumed = metrics.consumed.labels(name)
        self._m_buffered = metrics.buffered_messages.labels(name)
        self._m_bytes = metrics.buffered_bytes.labels(name)
        self._m_paused = metrics.paused_partitions.labels(name)
        self._m_longest_pause = metrics.longest_pause.labels(name)
        self._m_lag = metrics.consumer_lag.labels(name)
        self._m_commits = metrics.commits.labels(name)
        self._m_assigned = metrics.assigned_partitions.labels(name)
        self.paused: set[int] = set()
        self._rewind: dict[int, int] = {}
        self._to_resume_on_assign: list[int] = []
        self._stopping = threading.Event()
        self.broker_down = False
        self._thread = threading.Thread(
            target=self._main, name=f"consumer-{level.topic}", daemon=True
        )

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def request_stop(self) -> None:
        self._stopping.set()

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def on_error(self, error: KafkaError) -> None:
        """librdkafka's error callback; runs on this thread during poll."""
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            self.broker_down = True
            log.warning("%s: all brokers are down; retrying", self.level.topic)
        elif error.fatal():
            self._on_fatal(f"consumer of {self.level.topic}: {error.str()}")
        else:
            log.info("%s: %s", self.level.topic, error.str())

    # -- the loop ------------------------------------------------------------------
    def _main(self) -> None:
        self._run()
        try:
            self._shutdown()
        except Exception:
            log.exception(
                "%s: shutdown failed; uncommitted records will be re-read", self.level.topic
            )

    def _run(self) -> None:
        consumer = self._consumer
        try:
            consumer.subscribe(
                [self.level.topic],
                on_assign=self._assigned,
                on_revoke=self._revoked,
                on_lost=self._lost,
            )
            next_commit = next_lag = next_probe = time.monotonic()
            while not self._stopping.is_set():
                messages = self._next_messages()
                if self._to_resume_on_assign:
                    self._resume_fresh()
                admitted = 0
                due: list[tuple[HeldRecord, float]] = []
                for message in messages:
                    admitted += self._admit(message, due)
                if admitted:
                    self._scheduler.schedule_many(due)
                    self._m_consumed.inc(admitted)
                    self._forwarder.try_drain()
                if self._rewind:
                    self._apply_rewinds()
                self._producer.poll(0)
                self._resume_drained()
                now = time.monotonic()
                if now >= next_commit:
                    self._commit(asynchronous=True)
                    next_commit = now + self._commit_interval
                if now >= next_lag:
                    self._update_gauges(lag=True)
                    next_lag = now + LAG_INTERVAL_S
                else:
                    self._update_gauges(lag=False)
                if self.broker_down and now >= next_probe:
                    self._probe_broker()
                    next_probe = now + PROBE_INTERVAL_S
        except Exception as exc:
            log.exception("consumer of %s stopped", self.level.topic)
            self._on_fatal(f"consumer of {self.level.topic} failed: {exc}")

    def _next_messages(self) -> list[Message]:
        """The next batch, without waiting for a full one.

        consume(n, t) waits for n records or t; take what is queued at once and block
        only for the first record, so a partly fetchable backlog (paused partitions)
        never waits out the timeout per batch.
        """
        messages = self._consumer.consume(BATCH, 0)
        if messages:
            return messages
        if self.paused and len(self.paused) >= len(self._ledger.partitions):
            # Nothing can be read: wait for the acknowledgements that free the buffer
            # and resume partitions, rather than for records.
            self._producer.poll(POLL_TIMEOUT_S)
            return []
        return self._consumer.consume(1, POLL_TIMEOUT_S)

    def _shutdown(self) -> None:
        """Runs after the loop: stop forwarding, wait for acks, commit, leave the group."""
        self._forwarder.stop(timeout=5.0)
        remaining = self._producer.flush(self._flush_timeout)
        self._forwarder.publish_counts()
        if remaining:
            log.warning(
                "%s: %d forwards unacknowledged at shutdown; they will be re-read",
                self.level.topic,
                remaining,
            )
        try:
            self._commit(asynchronous=False)
        except KafkaException as exc:
            log.warning(
                "%s: final commit failed (%s); records will be re-read", self.level.topic, exc
            )
        self._consumer.close()
        self._producer.close()

    # -- admitting records ---------------------------------------------------------
    def _admit(self, message: Message, due: list[tuple[HeldRecord, float]]) -> int:
        """1 if the record was taken (appended to `due` for the buffer), 0 if not."""
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                self.on_error(error)
            return 0
        self.broker_down = False
        partition = message.partition()
        offset = message.offset()
        if partition is None or offset is None:
            return 0
        if partition in self.paused or partition in self._rewind:
            self._rewind.setdefault(partition, offset)
            return 0
        ledger = self._ledger.partitions.get(partition)
        if ledger is None:
            return 0  # not ours any more; the new owner reads it
        key = message.key()
        value = message.value()
        headers = message.headers()
        if isinstance(headers, dict):  # the client returns a list; the stubs allow a dict
            headers = list(headers.items())
        try:
            envelope, user_headers, header_bytes = unwrap(headers)
        except EnvelopeError as exc:
            envelope, user_headers, problem = None, headers or [], str(exc)
            header_bytes = record_size(None, None, headers)
        size = header_bytes + (len(key) if key else 0) + (len(value) if value else 0)
        if not self._flow.admits(self._ledger, ledger, size):
            self._pause(partition)
            self._rewind[partition] = offset
            return 0
        self._ledger.track(ledger, offset, size)
        ts_type, ts = message.timestamp()
        base_ms = ts if ts_type != TIMESTAMP_NOT_AVAILABLE else int(time.time() * 1000)
        if envelope is None:
            record = HeldRecord(
                ledger,
                partition,
                offset,
                key,
                value,
                user_headers,
                size,
                None,
                base_ms,
                dead_letter=(dl.REASON_ENVELOPE, problem),
            )
            self._forwarder.send(record)
            return 1
        due_ms = base_ms + self.level.delay_ms
        record = HeldRecord(
            ledger, partition, offset, key, value, user_headers, size, envelope, due_ms
        )
        due.append((record, due_ms / 1000))
        return 1

    def _pause(self, partition: int) -> None:
        self._consumer.pause([TopicPartition(self.level.topic, partition)])
        self.paused.add(partition)
        ledger = self._ledger.partitions.get(partition)
        if ledger is not None and ledger.paused_since is None:
            ledger.paused_since = time.monotonic()
        log.debug("%s[%d] paused", self.level.topic, partition)

    def _apply_rewinds(self) -> None:
        for partition, offset in self._rewind.items():
            if partition in self._ledger.partitions:
                self._consumer.seek(TopicPartition(self.level.topic, partition, offset))
        self._rewind.clear()

    def _resume_drained(self) -> None:
        if not self.paused:
            return
        ready = []
        for partition in self.paused:
            ledger = self._ledger.partitions.get(partition)
            if ledger is None or self._flow.may_resume(self._ledger, ledger):
                ready.append(partition)
        if not ready:
            return
        live = [p for p in ready if p in self._ledger.partitions]
        if live:
            self._consumer.resume([TopicPartition(self.level.topic, p) for p in live])
        for partition in ready:
            self.paused.discard(partition)
            ledger = self._ledger.partitions.get(partition)
            if ledger is not None:
                ledger.paused_since = None

    # -- rebalancing ---------------------------------------------------------------
    def _assigned(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._ledger.assign(tp.partition)
            self.paused.discard(tp.partition)
            self._to_resume_on_assign.append(tp.partition)
        log.info("%s: assigned %s", self.level.topic, sorted(tp.partition for tp in partitions))

    def _resume_fresh(self) -> None:
        tps = [
            TopicPartition(self.level.topic, p)
            for p in self._to_resume_on_assign
            if p in self._ledger.partitions and p not in self.paused
        ]
        self._to_resume_on_assign.clear()
        if tps:
            self._consumer.resume(tps)

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        safe = []
        for tp in partitions:
            ledger = self._ledger.partitions.get(tp.partition)
            if ledger is not None:
                offset = ledger.committable()
                if offset is not None and offset != ledger.last_committed:
                    safe.append(TopicPartition(self.level.topic, tp.partition, offset))
        self._drop(partitions)
        if safe:
            try:
                consumer.commit(offsets=safe, asynchronous=False)
                self._m_commits.inc()
            except KafkaException as exc:
                log.warning(
                    "%s: commit on revoke failed (%s); records will be re-read",
                    self.level.topic,
                    exc,
                )
        log.info("%s: revoked %s", self.level.topic, sorted(tp.partition for tp in partitions))

    def _lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._drop(partitions)
        log.warning("%s: lost %s", self.level.topic, sorted(tp.partition for tp in partitions))

    def _drop(self, partitions: list[TopicPartition]) -> None:
        gone = {tp.partition for tp in partitions}
        ledgers = {id(ledger) for p in gone if (ledger := self._ledger.revoke(p)) is not None}
        self._scheduler.remove_where(lambda record: id(record.ledger) in ledgers)
        self.paused -= gone
        for partition in gone:
            self._rewind.pop(partition, None)

    # -- commits and gauges --------------------------------------------------------
    def _commit(self, *, asynchronous: bool) -> None:
        pairs = self._ledger.to_commit()
        if not pairs:
            return
        offsets = [TopicPartition(self.level.topic, p, o) for p, o in pairs]
        if asynchronous:
            self._consumer.commit(offsets=offsets, asynchronous=True)
        else:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        self._ledger.committed(pairs)
        self._m_commits.inc()

    def _update_gauges(self, *, lag: bool) -> None:
        self._forwarder.publish_counts()
        ledger = self._ledger
        self._m_buffered.set(ledger.total_buffered)
        self._m_bytes.set(ledger.total_bytes)
        self._m_paused.set(len(self.paused))
        self._m_longest_pause.set(ledger.longest_pause())
        self._m_assigned.set(len(ledger.partitions))
        if lag:
            self._m_lag.set(self._lag())

    def _lag(self) -> int:
        tps = [TopicPartition(self.level.topic, p) for p in list(self._ledger.partitions)]
        if not tps:
            return 0
        total = 0
        for tp in self._consumer.position(tps):
            low, high = self._consumer.get_watermark_offsets(tp, cached=True)
            if high < 0:
                continue
            position = tp.offset if tp.offset >= 0 else low
            total += max(0, high - position)
        return total

    def _probe_broker(self) -> None:
        try:
            self._consumer.list_topics(self.level.topic, timeout=1.0)
        except KafkaException:
            return
        self.broker_down = False
        log.info("%s: broker reachable again", self.level.topic)
