"""The forwarder thread: takes due records from the level's buffer and re-publishes them.

It sleeps inside the buffer's `take_expired` until the earliest due time and is woken
early when an earlier record arrives; it never polls on a tick. It never touches the
consumer: it reports outcomes by settling records in the level's ledger, and the
consumer thread turns settled records into commits.

Outcomes of a forward, decided in the delivery callback:
- acknowledged: settle (the offset may commit);
- a permanent refusal (unknown topic or partition, too large, not authorized,
  invalid record): send the record to the dead-letter topic, settle on its ack;
- anything else: retry after an exponential backoff. Retrying never makes a record
  early, and the record stays unsettled, so nothing is lost while the broker is away.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from delayservice.envelope import Headers
from delayservice.errors import DelayServiceError
from delayservice.kafka.target_topics import TargetTopics
from delayservice.levels import Level
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.timers.base import Scheduler
from delayservice.worker import dead_letter as dl
from delayservice.worker.ledger import LevelLedger
from delayservice.worker.record import HeldRecord

log = logging.getLogger(__name__)

_PERMANENT: dict[int, str] = {
    KafkaError.UNKNOWN_TOPIC_OR_PART: dl.REASON_UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_TOPIC: dl.REASON_UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION: dl.REASON_UNKNOWN_PARTITION,
    KafkaError.MSG_SIZE_TOO_LARGE: dl.REASON_TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE: dl.REASON_TOO_LARGE,
    KafkaError.TOPIC_AUTHORIZATION_FAILED: dl.REASON_NOT_AUTHORIZED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: dl.REASON_NOT_AUTHORIZED,
    KafkaError.INVALID_RECORD: dl.REASON_REJECTED,
    KafkaError.POLICY_VIOLATION: dl.REASON_REJECTED,
    KafkaError.INVALID_MSG: dl.REASON_REJECTED,
    KafkaError.INVALID_TIMESTAMP: dl.REASON_REJECTED,
    KafkaError.INVALID_REQUIRED_ACKS: dl.REASON_REJECTED,
}


def permanent_reason(error: KafkaError) -> str | None:
    """The dead-letter reason for an error no retry can fix, else None."""
    return _PERMANENT.get(error.code())


class Forwarder:
    def __init__(
        self,
        level: Level,
        scheduler: Scheduler[HeldRecord],
        ledger: LevelLedger,
        producer: Any,
        targets: TargetTopics,
        dead_letter_topic: str,
        metrics: ServiceMetrics,
        backoff: tuple[float, float],
        on_fatal: Callable[[str], None],
    ) -> None:
        self.level = level
        self._scheduler = scheduler
        self._ledger = ledger
        self._producer = producer
        self._targets = targets
        self._dlq_topic = dead_letter_topic
        self._backoff_first, self._backoff_max = backoff
        self._on_fatal = on_fatal
        name = level.name
        self._m_forwarded = metrics.forwarded.labels(name)
        self._m_lateness = metrics.lateness
        metrics.lateness.labels(name)
        self._lateness: deque[float] = deque()  # filled by delivery reports, folded in batches
        self._m_dead = metrics.dead_lettered
        for reason in dl.REASONS:  # exported at 0 from the start, so rate() sees the first one
            self._m_dead.labels(name, reason)
        self._m_errors = metrics.forward_errors
        self._published = 0  # acknowledged forwards already added to the counter
        self._send_lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"forwarder-{level.topic}", daemon=True
        )

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stopping.set()
        self._scheduler.wakeup()
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        scheduler = self._scheduler
        try:
            while not self._stopping.is_set():
                scheduler.wait_due(None)
                with self._send_lock:
                    self._drain()
        except Exception as exc:
            log.exception("forwarder of %s stopped", self.level.topic)
            self._on_fatal(f"forwarder of {self.level.topic} failed: {exc}")

    def try_drain(self) -> None:
        """Forward what is due now, from the caller's thread, unless the forwarder is busy.

        Kafka's purgatory tries to complete an operation before it watches it; this is
        the same idea. When a backlog is read, records arrive already due, and sending
        them from the consumer thread saves a hand-over per batch. Taking and sending
        happen under one lock on either thread, so records still leave in due order.
        """
        if self._send_lock.acquire(blocking=False):
            try:
                self._drain()
            finally:
                self._send_lock.release()

    def _drain(self) -> None:
        """Send every due record; the caller holds the send lock."""
        records = self._scheduler.take_expired(0)
        for record in records:  # the scheduler returns them in due order
            if self._stopping.is_set():
                return  # not forwarded, not settled: re-read after restart
            self.send(record)
        if records:
            self._producer.poll(0)

    # -- sending -------------------------------------------------------------------
    def send(self, record: HeldRecord) -> None:
        if record.ledger.revoked:
            return  # partition moved to another instance, which re-reads it
        if record.dead_letter is not None:
            self._send_dead_letter(record)
            return
        envelope = record.envelope
        assert envelope is not None
        now = time.time()
        if now * 1000 < record.due_ms:  # the never-early guard, whatever the buffer did
            self._scheduler.schedule(record, record.due_ms / 1000)
            return
        try:
            partitions = self._targets.partitions(envelope.target)
        except DelayServiceError as exc:
            self._retry(record, "metadata", str(exc))
            return
        if isinstance(partitions, KafkaError):
            self._to_dead_letter(
                record,
                permanent_reason(partitions) or dl.REASON_UNKNOWN_TOPIC,
                f"target topic {envelope.target!r}: {partitions.str()}",
            )
            return
        if envelope.partition is not None and envelope.partition >= partitions:
            self._to_dead_letter(
                record,
                dl.REASON_UNKNOWN_PARTITION,
                f"partition {envelope.partition} of {envelope.target!r} does not exist "
                f"(it has {partitions})",
            )
            return
        on_delivery = functools.partial(self._delivered, record)
        kwargs: dict[str, Any] = {}
        if envelope.partition is not None:
            kwargs["partition"] = envelope.partition
        try:
            self._produce(
                envelope.target,
                record.key,
                record.value,
                record.forward_headers(),
                on_delivery,
                kwargs,
            )
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            reason = permanent_reason(error)
            if reason is None:
                self._retry(record, error.name(), error.str())
            else:
                self._to_dead_letter(record, reason, error.str())
            return

    def _produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        on_delivery: Callable[[Any, Any], None],
        kwargs: dict[str, Any],
    ) -> None:
        while True:
            try:
                self._producer.produce(
                    topic, value, key, headers=headers, on_delivery=on_delivery, **kwargs
                )
                return
            except BufferError:
                # The local queue is full: serve delivery reports until there is room.
                self._producer.poll(0.1)

    def _delivered(self, record: HeldRecord, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self._ledger.settle(record.ledger, record.offset, record.size, forwarded=True)
            # Lateness once per delivered record: its timestamp is when it was produced.
            self._lateness.append(max(0.0, (msg.timestamp()[1] - record.due_ms) / 1000))
            return
        if err.fatal():
            self._on_fatal(f"producer of {self.level.topic} hit a fatal error: {err.str()}")
            return
        reason = permanent_reason(err)
        if reason is not None:
            self._to_dead_letter(record, reason, err.str())
        else:
            self._retry(record, err.name(), err.str())

    def publish_counts(self) -> None:
        """Fold delivery outcomes into the metrics in batches, off the per-ack path.

        Called from the consumer thread only, the single reader of the lateness queue.
        """
        lateness = self._lateness
        if lateness:
            popped = [lateness.popleft() for _ in range(len(lateness))]
            self._m_lateness.observe_many(self.level.name, popped)
        acked = self._ledger.forwarded
        if acked != self._published:
            self._m_forwarded.inc(acked - self._published)
            self._published = acked

    # -- failure paths -------------------------------------------------------------
    def _retry(self, record: HeldRecord, error_name: str, detail: str) -> None:
        record.attempts += 1
        delay = min(self._backoff_max, self._backoff_first * 2 ** (record.attempts - 1))
        self._m_errors.labels(self.level.name, error_name).inc()
        log.warning(
            "forward of %s[%d]@%d failed (%s), retry %d in %.1fs",
            self.level.topic,
            record.partition,
            record.offset,
            detail,
            record.attempts,
            delay,
        )
        self._scheduler.schedule(record, time.time() + delay)

    def _to_dead_letter(self, record: HeldRecord, reason: str, detail: str) -> None:
        record.dead_letter = (reason, detail)
        self._send_dead_letter(record)

    def _send_dead_letter(self, record: HeldRecord) -> None:
        assert record.dead_letter is not None
        reason, detail = record.dead_letter
        log.warning(
            "dead-lettering %s[%d]@%d: %s (%s)",
            self.level.topic,
            record.partition,
            record.offset,
            reason,
            detail,
        )
        headers = dl.dead_letter_headers(
            record.original_headers(),
            reason,
            detail,
            self.level.topic,
            record.partition,
            record.offset,
        )
        try:
            self._produce(
                self._dlq_topic,
                record.key,
                record.value,
                headers,
                functools.partial(self._dead_lettered, record),
                {},
            )
        except KafkaException as exc:
            self._retry(record, exc.args[0].name(), exc.args[0].str())

    def _dead_lettered(self, record: HeldRecord, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self._ledger.settle(record.ledger, record.offset, record.size)
            assert record.dead_letter is not None
            self._m_dead.labels(self.level.name, record.dead_letter[0]).inc()
        elif err.fatal():
            self._on_fatal(f"producer of {self.level.topic} hit a fatal error: {err.str()}")
        else:
            # The dead-letter topic itself refused: keep the record unsettled and retry.
            self._retry(record, err.name(), f"dead-letter topic: {err.str()}")
