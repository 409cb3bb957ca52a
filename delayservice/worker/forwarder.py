"""The forwarder thread: takes due records from the level's buffer and re-publishes them.

It sleeps inside the buffer's `wait_due` until the earliest due time and is woken
early when an earlier record arrives; it never polls on a tick. It never touches the
consumer: it reports outcomes by settling records in the level's ledger, and the
consumer thread turns settled records into commits.

Outcomes of a forward, decided in the delivery callback:
- acknowledged: settle (the offset may commit);
- a permanent refusal (unknown or invalid topic, unknown partition, too large, not
  authorized, invalid record): send the record to the dead-letter topic, settle on
  its ack; a dead letter too large for that topic goes as a payload-free stub;
- anything else: retry after an exponential backoff. Retrying never makes a record
  early, and the record stays unsettled, so nothing is lost while the broker is away.
  A record that keeps failing while its target accepts other records fails for a
  reason of its own: after `give_up_s` it is dead-lettered as `retries_exhausted`.
  An outage that refuses every record therefore dead-letters nothing.

No exception from one record escapes `send` or a delivery callback.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, Message

from delayservice.envelope import Headers
from delayservice.errors import DelayServiceError
from delayservice.kafka.client_seam import ProducerClient
from delayservice.kafka.target_topics import TargetTopics
from delayservice.levels import Level
from delayservice.log_throttle import Throttle
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.settings import Settings
from delayservice.timers.base import Scheduler
from delayservice.worker import dead_letter as dl
from delayservice.worker.failures import TOO_LARGE, UNKNOWN_TARGET, permanent_reason
from delayservice.worker.ledger import LevelLedger
from delayservice.worker.record import HeldRecord

log = logging.getLogger(__name__)

_TOO_LARGE = TOO_LARGE
_UNKNOWN = UNKNOWN_TARGET
QUEUE_FULL_WAIT_S: Final = 1.0
"""How long a send waits for room in the producer's queue before handing its records back."""
_ACK_MEMORY: Final = 10_000


UNCONFIRMED: Final = "unconfirmed_ack"
"""forward_errors label: an acknowledgement without an offset, so the record went again."""


def _confirmed(msg: Message) -> bool:
    """Whether a successful delivery report carries the offset the broker assigned."""
    offset = msg.offset()
    return offset is not None and offset >= 0


class QueueFullError(DelayServiceError):
    """The producer's local queue stayed full, or a stop was asked for, while sending."""

    def __init__(self) -> None:
        super().__init__("the producer's queue is full", retriable=True)


class Forwarder:
    def __init__(
        self,
        level: Level,
        scheduler: Scheduler[HeldRecord],
        ledger: LevelLedger,
        producer: ProducerClient,
        targets: TargetTopics,
        dead_letter_topic: str,
        metrics: ServiceMetrics,
        backoff: tuple[float, float],
        on_fatal: Callable[[str], None],
        give_up_s: float = 300.0,
    ) -> None:
        self.level = level
        self._scheduler = scheduler
        self._ledger = ledger
        self._producer = producer
        self._targets = targets
        self._dlq_topic = dead_letter_topic
        self._backoff_first, self._backoff_max = backoff
        self._give_up_s = give_up_s
        self._on_fatal = on_fatal
        name = level.name
        self._m_forwarded = metrics.forwarded.labels(name)
        self._m_lateness = metrics.lateness
        metrics.lateness.labels(name)
        self._lateness: deque[float] = deque()  # filled by delivery reports, folded in batches
        self._m_dead = metrics.dead_lettered
        for reason in dl.REASONS:  # exported at 0 from the start, so rate() sees the first one
            self._m_dead.labels(name, reason)
        self._m_stubs = metrics.dead_letter_stubs.labels(name)
        self._m_errors = metrics.forward_errors
        self._m_loop_errors = metrics.loop_errors.labels(name, "forwarder")
        self._published = 0  # acknowledged forwards already added to the counter
        # (target, partition or -1) -> monotonic time of its last acknowledged forward
        self._acked_at: dict[tuple[str, int], float] = {}
        self._throttle = Throttle()
        self._send_lock = threading.Lock()
        self._no_wait = threading.local()  # set while `submit` sends: never wait for room
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"forwarder-{level.topic}", daemon=True
        )

    @classmethod
    def configured(
        cls,
        level: Level,
        scheduler: Scheduler[HeldRecord],
        ledger: LevelLedger,
        producer: ProducerClient,
        targets: TargetTopics,
        settings: Settings,
        metrics: ServiceMetrics,
        on_fatal: Callable[[str], None],
    ) -> Forwarder:
        """A forwarder with the retry and dead-letter rules the settings give."""
        return cls(
            level,
            scheduler,
            ledger,
            producer,
            targets,
            settings.dead_letter_topic,
            metrics,
            (settings.retry_backoff_s, settings.retry_backoff_max_s),
            on_fatal,
            give_up_s=settings.retry_give_up_s,
        )

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def request_stop(self) -> None:
        """Stop sending now: a send waiting for room in the queue gives up at once."""
        self._stopping.set()
        self._scheduler.wakeup()

    def stop(self, timeout: float) -> None:
        self.request_stop()
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        scheduler = self._scheduler
        while not self._stopping.is_set():
            try:
                scheduler.wait_due(None)
                with self._send_lock:
                    self._drain()
            except Exception:
                self._m_loop_errors.inc()
                log.exception("forwarder of %s: unexpected error; continuing", self.level.topic)
                self._stopping.wait(0.5)

    def forward_now(self, records: list[HeldRecord]) -> None:
        """Forward what is due now, from the consumer thread, unless the forwarder is busy.

        Kafka's purgatory tries to complete an operation before it watches it; this is
        the same idea. `records` were already due when read (a backlog after an outage
        is all due): they skip the buffer (no push, no pop) and go out after whatever
        the buffer holds that is due. Taking and sending happen under one lock on
        either thread, so records still leave in due order; if the forwarder thread is
        sending, `records` join the buffer instead of waiting for it.
        """
        if not self._send_lock.acquire(blocking=False):
            self._scheduler.schedule_many([(r, r.due_ms / 1000) for r in records])
            return
        try:
            self._drain()
            self._send_all(records)
        finally:
            self._send_lock.release()

    def try_drain(self) -> None:
        """`forward_now` with nothing read: send what the buffer holds that is due."""
        self.forward_now([])

    def _drain(self) -> None:
        """Send every due record; the caller holds the send lock."""
        self._send_all(self._scheduler.take_expired(0))  # returned in due order

    def _send_all(self, records: list[HeldRecord]) -> None:
        """Send in order; the caller holds the send lock."""
        for i, record in enumerate(records):
            try:
                self.send(record)
            except QueueFullError:
                # Hand the rest back at their due times, in order; a stop leaves them
                # unsettled, to be re-read after the restart.
                if not self._stopping.is_set():
                    self._scheduler.schedule_many([(r, r.due_ms / 1000) for r in records[i:]])
                break
        if records:
            self._producer.poll(0)

    # -- sending -------------------------------------------------------------------
    def submit(self, record: HeldRecord) -> None:
        """`send`, for the consumer thread, which must neither block nor fail: a full
        queue defers the record to the buffer at once instead of waiting for room."""
        self._no_wait.active = True
        try:
            self.send(record)
        except QueueFullError:
            self._later(record)
        finally:
            self._no_wait.active = False

    def _later(self, record: HeldRecord) -> None:
        self._scheduler.schedule(record, max(time.time(), record.due_ms / 1000))

    def send(self, record: HeldRecord) -> None:
        """Forward or dead-letter one record. Raises only `QueueFullError`."""
        try:
            self._send(record)
        except QueueFullError:
            raise
        except Exception as exc:
            log.exception(
                "%s[%d]@%d: unexpected error while forwarding",
                self.level.topic,
                record.partition,
                record.offset,
            )
            reason, detail = record.dead_letter or (
                dl.REASON_INTERNAL,
                f"{type(exc).__name__}: {exc}",
            )
            self._to_dead_letter_safely(record, reason, detail)

    def _send(self, record: HeldRecord) -> None:
        if record.ledger.revoked:
            return  # partition moved to another instance, which re-reads it
        if record.dead_letter is not None:
            self._send_dead_letter(record)
            return
        envelope = record.envelope
        assert envelope is not None
        if time.time() * 1000 < record.due_ms:  # the never-early guard, whatever the buffer did
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
            try:  # the topic may have grown since it was cached
                partitions = self._targets.partitions(envelope.target, fresh=True)
            except DelayServiceError as exc:
                self._retry(record, "metadata", str(exc))
                return
            if isinstance(partitions, int) and envelope.partition >= partitions:
                self._to_dead_letter(
                    record,
                    dl.REASON_UNKNOWN_PARTITION,
                    f"partition {envelope.partition} of {envelope.target!r} does not exist "
                    f"(it has {partitions})",
                )
                return
        kwargs: dict[str, Any] = {}
        if envelope.partition is not None:
            kwargs["partition"] = envelope.partition
        try:
            self._produce(
                envelope.target,
                record.key,
                record.value,
                record.forward_headers(),
                functools.partial(self._delivered, record),
                kwargs,
            )
        except KafkaException as exc:
            self._failed(record, exc.args[0])

    def _produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        on_delivery: Callable[[Any, Any], None],
        kwargs: dict[str, Any],
    ) -> None:
        """Produce, serving delivery reports while the local queue is full, for at most
        `QUEUE_FULL_WAIT_S` and never past a stop request, so neither thread can be held
        here past the consumer's poll interval."""
        deadline = None
        while True:
            try:
                self._producer.produce(
                    topic, value, key, headers=headers, on_delivery=on_delivery, **kwargs
                )
                return
            except BufferError:
                if deadline is None:  # decided only when the queue is full: a thread-local
                    # read per record cost as much as a sixth of the produce call
                    wait = 0.0 if getattr(self._no_wait, "active", False) else QUEUE_FULL_WAIT_S
                    deadline = time.monotonic() + wait
                if self._stopping.is_set() or time.monotonic() >= deadline:
                    raise QueueFullError from None
                self._producer.poll(0.05)

    def _delivered(self, record: HeldRecord, err: KafkaError | None, msg: Message) -> None:
        try:
            if err is None and not _confirmed(msg):
                self._unconfirmed(record, msg)
                return
            if err is None:
                self._ledger.settle(record.ledger, record.offset, record.size, forwarded=True)
                # Lateness once per delivered record: its timestamp is when it was produced.
                self._lateness.append(max(0.0, (msg.timestamp()[1] - record.due_ms) / 1000))
                if record.envelope is not None:
                    self._acked(record.envelope.target, msg.partition())
                return
            partition = msg.partition()
            self._failed(record, err, partition if partition is not None else -1)
        except QueueFullError:
            self._later(record)
        except Exception:
            self._m_loop_errors.inc()
            log.exception("%s: a delivery report could not be handled", self.level.topic)

    def _acked(self, target: str, partition: int | None) -> None:
        acked = self._acked_at
        if len(acked) >= _ACK_MEMORY and (target, -1) not in acked:
            acked.clear()
        now = time.monotonic()
        acked[(target, -1)] = now
        if partition is not None and partition >= 0:
            acked[(target, partition)] = now

    def _failed(self, record: HeldRecord, err: KafkaError, partition: int = -1) -> None:
        if record.ledger.revoked:
            return  # the partition's new owner re-reads and decides
        if err.fatal():
            self._on_fatal(f"producer of {self.level.topic} hit a fatal error: {err.str()}")
            return
        reason = permanent_reason(err)
        if reason is None:
            if partition >= 0:
                record.failed_partition = partition
            self._retry(record, err.name(), err.str())
            return
        if err.code() in _UNKNOWN and record.envelope is not None:
            self._targets.forget(record.envelope.target)
        self._to_dead_letter(record, reason, err.str())

    def publish_counts(self) -> None:
        """Fold delivery outcomes into the metrics in batches, off the per-ack path.

        Called from the consumer thread only, the single reader of the lateness queue.
        It serves the producer's delivery reports too: this forwarder's producer is its
        own, and nothing else polls it between sends.
        """
        self._producer.poll(0)
        lateness = self._lateness
        if lateness:
            popped = [lateness.popleft() for _ in range(len(lateness))]
            self._m_lateness.observe_many(self.level.name, popped)
        acked = self._ledger.forwarded
        if acked != self._published:
            self._m_forwarded.inc(acked - self._published)
            self._published = acked

    # -- failure paths -------------------------------------------------------------
    def _unconfirmed(self, record: HeldRecord, msg: Message) -> None:
        """A success the broker never confirmed: send again, accepting a duplicate.

        After an uncertain failure (a timeout, a lost connection, an error on a topic that
        was being deleted) librdkafka's idempotent producer reports a message as delivered
        when a later one on the same partition succeeds, on the grounds that the broker
        would have refused the later one otherwise. That holds for one partition's life,
        but not across a topic deleted and re-created under the same name: the new
        partition accepts the later batch and the earlier message was never written.
        Such inferred reports carry no offset, so they are the ones sent again; a
        duplicate keeps its `delay-id`, a loss could not be found again.
        """
        self._retry(
            record,
            UNCONFIRMED,
            f"{msg.topic()}[{msg.partition()}]: delivery inferred from a later "
            "acknowledgement, not confirmed by the broker; sending again",
        )

    def _retry(self, record: HeldRecord, error_name: str, detail: str) -> None:
        now = time.monotonic()
        if record.first_failure is None:
            record.first_failure = now
        elif self._exhausted(record, now):
            self._to_dead_letter(
                record,
                dl.REASON_RETRIES_EXHAUSTED,
                f"failing for {now - record.first_failure:.0f}s while its target accepted "
                f"other records; last error: {detail}",
            )
            return
        record.attempts += 1
        delay = min(self._backoff_max, self._backoff_first * 2 ** min(record.attempts - 1, 30))
        self._m_errors.labels(self.level.name, error_name).inc()
        held_back = self._throttle.allow(("retry", error_name))
        if held_back is not None:
            log.warning(
                "forward of %s[%d]@%d failed (%s), retry %d in %.1fs%s",
                self.level.topic,
                record.partition,
                record.offset,
                dl.capped(detail),
                record.attempts,
                delay,
                f" ({held_back} more failures with {error_name} since the last line)"
                if held_back
                else "",
            )
        self._scheduler.schedule(record, time.time() + delay)

    def _exhausted(self, record: HeldRecord, now: float) -> bool:
        """Failing long enough, and for a reason of its own: the partition it goes to (or,
        when that is unknown, its target) acknowledged other records since."""
        if record.dead_letter is not None or record.envelope is None:
            return False  # a dead letter that fails waits for the dead-letter topic
        assert record.first_failure is not None
        if now - record.first_failure < self._give_up_s:
            return False
        envelope = record.envelope
        partition = envelope.partition if envelope.partition is not None else -1
        if partition < 0:
            partition = record.failed_partition
        last_ack = self._acked_at.get((envelope.target, partition), float("-inf"))
        return last_ack > record.first_failure

    def _to_dead_letter(self, record: HeldRecord, reason: str, detail: str) -> None:
        record.dead_letter = (reason, detail)
        self._send_dead_letter(record)

    def _to_dead_letter_safely(self, record: HeldRecord, reason: str, detail: str) -> None:
        """Dead-letter a record whose handling raised; if the copy itself cannot be
        produced, try a stub (only headers this service writes); failing that, try again
        later. Nothing escapes, and the record stays unsettled until it is written."""
        try:
            self._to_dead_letter(record, reason, detail)
            return
        except QueueFullError:
            self._later(record)
            return
        except Exception:
            log.exception("%s: could not dead-letter a record", self.level.topic)
        try:
            if not record.stub:
                record.stub = True
                self._send_dead_letter(record)
                return
        except QueueFullError:
            self._later(record)
            return
        except Exception:
            log.exception("%s: could not dead-letter a record's stub", self.level.topic)
        self._m_loop_errors.inc()
        self._scheduler.schedule(record, time.time() + self._backoff_max)

    def _send_dead_letter(self, record: HeldRecord) -> None:
        if record.ledger.revoked:
            return
        assert record.dead_letter is not None
        reason, detail = record.dead_letter
        held_back = self._throttle.allow(("dead-letter", reason))
        if held_back is not None:
            log.warning(
                "dead-lettering %s[%d]@%d: %s (%s)%s%s",
                self.level.topic,
                record.partition,
                record.offset,
                reason,
                dl.capped(detail),
                " as a stub" if record.stub else "",
                f" ({held_back} more with this reason since the last line)" if held_back else "",
            )
        origin = (self.level.topic, record.partition, record.offset)
        original = record.original_headers()
        if record.stub:
            key, value = None, None
            headers = dl.stub_headers(record.key, record.value, original, reason, detail, origin)
        else:
            key, value = record.key, record.value
            headers = dl.dead_letter_headers(original, reason, detail, *origin)
        try:
            self._produce(
                self._dlq_topic,
                key,
                value,
                headers,
                functools.partial(self._dead_lettered, record),
                {},
            )
        except KafkaException as exc:
            self._dead_letter_failed(record, exc.args[0])

    def _dead_lettered(self, record: HeldRecord, err: KafkaError | None, msg: Message) -> None:
        try:
            if err is None and not _confirmed(msg):
                self._unconfirmed(record, msg)
                return
            if err is None:
                self._ledger.settle(record.ledger, record.offset, record.size)
                assert record.dead_letter is not None
                self._m_dead.labels(self.level.name, record.dead_letter[0]).inc()
                if record.stub:
                    self._m_stubs.inc()
                return
            self._dead_letter_failed(record, err)
        except QueueFullError:
            self._later(record)
        except Exception:
            self._m_loop_errors.inc()
            log.exception("%s: a dead-letter report could not be handled", self.level.topic)

    def _dead_letter_failed(self, record: HeldRecord, err: KafkaError) -> None:
        if err.fatal():
            self._on_fatal(f"producer of {self.level.topic} hit a fatal error: {err.str()}")
        elif err.code() in _TOO_LARGE and not record.stub:
            record.stub = True  # the copy does not fit: send what the operator needs
            self._send_dead_letter(record)
        else:
            # The dead-letter topic itself refused: keep the record unsettled and retry.
            self._retry(record, err.name(), f"dead-letter topic: {err.str()}")
