"""How the forwarder sends one record: forward or dead-letter, and the local checks
before it (Kafka's name rule, the target in the metadata cache, the partition in range;
the size limit is librdkafka's own, at produce()).

The happy path has no delivery callback: the level's producer reports only failures,
which `failures.Failures` places at the commit point. Records a report could not be
pinned to (`Failures.suspects`) go again with a callback each. No exception from one
record escapes `send_run`: it is dead-lettered (`internal_error`), or its partition
waits (`SendLaterError`) when it could not be sent now. What a mode decides for itself
(how a run goes out, how an envelope is read, markers, re-publishing) is its route's
(`forward.send_route`): this path asks no mode.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, Message

from delayservice import partitioners
from delayservice.envelope import H_DUE_MS, H_ID, Envelope, Headers
from delayservice.errors import DelayServiceError, EnvelopeError
from delayservice.forward import dead_letter as dl
from delayservice.forward.buffer import TP, Buffer
from delayservice.forward.failures import (
    Doom,
    Failures,
    Key,
    dead_letter_copy,
    permanent_reason,
)
from delayservice.forward.open_interval import OpenInterval
from delayservice.forward.send_errors import ForwarderFatalError, SendLaterError, producer_failed
from delayservice.forward.send_route import SendRoute
from delayservice.forward.target_names import TargetNames
from delayservice.kafka.client_errors import error_of, is_fatal, lost_client_error, raised_by
from delayservice.kafka.target_topics import TargetTopics
from delayservice.levels import Level
from delayservice.log_throttle import Throttle
from delayservice.metrics.service_metrics import ServiceMetrics

__all__ = ["ANY_PARTITION", "RecordSender", "Routes"]

log = logging.getLogger(__name__)

QUEUE_FULL_POLL_S: Final = 0.05
ANY_PARTITION: Final = -1
"""librdkafka's RD_KAFKA_PARTITION_UA: the partitioner decides (by key).

The fast paths call `Producer.produce` positionally, as (topic, value, key, partition,
callback, on_delivery, timestamp, headers): confluent-kafka parses a keyword argument
through a dictionary built per call, which cost about 3,700 instructions of the 23,000
a bare `produce(..., headers=...)` of a forwarded record takes (callgrind, 20,000
records). `tests/forward/test_positional_produce_kafka.py` holds that order to a real
broker."""


@dataclass
class Routes:
    """Where records go besides their targets, and the mode's decisions on the way."""

    dead_letter_topic: str
    reserved: frozenset[str]
    mode: Callable[[RecordSender, ServiceMetrics], SendRoute]
    """Builds the mode's route (`level.level_route`, `precise.precise_route`) for a
    sender, with the metrics it counts in."""


class RecordSender:
    """Owned by the forwarder thread, like the producer it sends through; it sends for
    every delay topic its forwarder serves (`levels`, by topic)."""

    def __init__(
        self,
        levels: Mapping[str, Level],
        group: Buffer,
        producer: Any,
        targets: TargetTopics,
        routes: Routes,
        metrics: ServiceMetrics,
        failures: Failures,
        stopping: threading.Event,
        clock: Any,
        worker: str,
        interval: OpenInterval,
    ) -> None:
        self.levels = dict(levels)
        self.worker = worker
        self.group = group
        self._producer = producer
        self._targets = targets
        self._dead_letter_topic = routes.dead_letter_topic
        self.failures = failures
        self._stopping = stopping
        self.clock = clock
        self._m_errors = metrics.forward_errors
        self._m_loop_errors = metrics.loop_errors.labels(worker, "forwarder")
        self._m_queue_full = {t: metrics.queue_full.labels(lv.name) for t, lv in levels.items()}
        self._throttle = Throttle()
        self._names = TargetNames(routes.reserved)
        self.interval = interval
        """Where what is sent is noted: re-published, dead-lettered, lateness, failures."""
        self._sending = ""
        """The delay topic whose run is being sent (what a full queue is counted against)."""
        self.route = routes.mode(self, metrics)

    def _count_queue_full(self) -> None:
        counter = self._m_queue_full.get(self._sending)
        if counter is not None:
            counter.inc()

    def lateness_of(self, topic: str) -> list[tuple[int, int]]:
        """Where the lateness of `topic`'s forwards in the open interval is counted."""
        lateness = self.interval.lateness
        kept = lateness.get(topic)
        if kept is None:
            kept = lateness[topic] = []
        return kept

    @property
    def producer(self) -> Any:
        """The producer sent through now (`replace_producer` changes it)."""
        return self._producer

    @property
    def targets(self) -> TargetTopics:
        """What is known of the topics sent to (`replace_producer` changes it)."""
        return self._targets

    def now_ms(self) -> int:
        return int(self.clock.time() * 1000)

    def replace_producer(self, producer: Any) -> None:
        """Send through `producer` from now on (the old one failed)."""
        self._producer = producer
        self._targets = TargetTopics(producer, clock=self.clock)

    def poll(self, timeout: float) -> None:
        """Serve the producer's callbacks. A fatal error comes out of here: confluent-kafka
        raises the fatal error event from the poll that serves it, once. A bare
        `KafkaError` comes out as the `KafkaException` it should have been, so that the
        callers' clean-ups (`except:` blocks that give back what was taken) see one."""
        failed = raised_by(lambda: self._producer.poll(timeout))
        if failed is not None:
            raise self._unusable(failed, "poll")

    def flush(self, timeout: float) -> int:
        """`Producer.flush`: how many forwards are still unacknowledged; a fatal error
        raised while it served the callbacks comes out as `ForwarderFatalError`."""
        left: list[int] = []
        failed = raised_by(lambda: left.append(int(self._producer.flush(timeout))))
        if failed is not None:
            raise self._unusable(failed, "flush")
        return left[0]

    def _unusable(self, exc: Exception, what: str) -> Exception:
        """`exc` as `ForwarderFatalError` (caused by it) when it says the producer is
        unusable."""
        error = error_of(exc)
        if error is not None and is_fatal(error):
            failure = producer_failed(error, f"{self.worker}: {what}")
            failure.__cause__ = exc
            return failure
        return exc

    def forget_target(self, topic: str) -> None:
        """The broker says `topic` does not exist: ask again next time."""
        self._targets.forget(topic)

    def on_report(self, error: KafkaError | None, message: Message) -> None:
        """librdkafka's delivery report, failures only; served on the forwarder's thread."""
        if error is not None:
            self.interval.reports.append((error, message, None))

    def _suspect_report(self, spot: Key, error: KafkaError | None, message: Message) -> None:
        """The report of a record sent with a callback of its own (see `Failures.suspects`)."""
        if error is not None:
            self.interval.reports.append((error, message, spot))

    def send_run(self, tp: TP, records: list[Any]) -> int:
        """Send one partition's due records in order; how many went (the rest must wait).
        The mode's route says how (`SendRoute.send_run`); whatever it does not send as it
        is, and anything that goes wrong, takes `send_one`."""
        self._sending = tp[0]
        return self.route.send_run(tp, records)

    def target_partitions(self, target: str) -> int:
        """The partition count of a valid, existing target, 0 otherwise."""
        return self._known_target(target) or 0

    @staticmethod
    def _partition_of(envelope: Envelope, key: Any, count: Any) -> int | None:
        """Where a forward goes: its explicit partition, as it is; else the one its
        producer's partitioner gives its key among the target's `count`; else (None)
        wherever the daemon's producer puts it."""
        if envelope.partition is not None or type(count) is not int:
            return envelope.partition
        return partitioners.place(envelope.partitioner, key, count)

    def _known_target(self, target: str) -> int | None:
        """The partition count of a valid, existing target, else None (the slow path
        decides what is wrong, and raises nothing here)."""
        if self._names.problem(target) is not None:
            return None
        try:
            count = self._targets.partitions(target)
        except DelayServiceError:
            return None
        return count if type(count) is int else None

    # -- the full path's steps, in the order a route takes them -------------------------
    def doom_of(self, tp: TP, record: Any) -> Doom | None:
        """Why an earlier failure dooms this record (`Failures.doomed`), if it does."""
        return self.failures.doomed.get((tp[0], tp[1], record.offset() or 0))

    def target_check(
        self, envelope: Envelope, problem: tuple[str, str] | None
    ) -> tuple[Any, tuple[str, str] | None]:
        """(the target's partition count, what makes it unsendable): Kafka's name rule,
        then the route's own `problem`, then the metadata and the partition's range.
        Decided where the record was read, not after a re-publish."""
        problem = self._names.problem(envelope.target) or problem
        if problem is not None:
            return None, problem
        count = self._targets.partitions(envelope.target)
        if type(count) is not int or (
            envelope.partition is not None and envelope.partition >= count
        ):
            problem = self._partition_problem(envelope, count)
        return count, problem

    def forward(
        self,
        tp: TP,
        record: Any,
        envelope: Envelope,
        user: Headers,
        due: int,
        count: Any,
        now_ms: int,
    ) -> None:
        """Produce the record to its target, with its id and the due time it went for."""
        spot = (tp[0], tp[1], record.offset() or 0)
        partition = self._partition_of(envelope, record.key(), count)
        user.append((H_ID, envelope.id.encode()))
        user.append((H_DUE_MS, str(due).encode()))
        if spot in self.failures.suspects:
            self._produce_suspect(spot, record, envelope.target, user, partition)
        else:
            self.produce(
                self._producer.produce,
                envelope.target,
                record.value(),
                record.key(),
                user,
                partition,
            )
        self.lateness_of(tp[0]).append((now_ms - due, 1))

    def failed(self, tp: TP, record: Any, exc: Exception) -> None:
        """What became of a record whose full path raised `exc` (called in the route's
        `except`): dead-lettered, or its partition waits (`SendLaterError`, raised, as
        is `ForwarderFatalError`). No exception from one record goes further."""
        if isinstance(exc, EnvelopeError):
            self._dead_letter_safely(tp, record, Doom(dl.REASON_ENVELOPE, str(exc)))
        elif isinstance(exc, (SendLaterError, ForwarderFatalError)):
            raise exc
        elif isinstance(exc, DelayServiceError):  # metadata could not be fetched: wait, retry
            self._m_errors.labels(self.levels[tp[0]].name, "metadata").inc()
            if self._throttle.allow("metadata") is not None:
                log.warning("%s: %s; retrying", tp[0], exc)
            raise SendLaterError(str(exc)) from exc
        elif isinstance(exc, KafkaException):
            self._refused_now(tp, record, exc)
        elif lost_client_error(exc):  # a producer call, not this record: it goes again
            raise SendLaterError("a producer call lost its error") from exc
        else:
            log.error(
                "%s[%d]@%d: unexpected error while forwarding",
                tp[0],
                tp[1],
                record.offset(),
                exc_info=exc,
            )
            self._dead_letter_safely(
                tp, record, Doom(dl.REASON_INTERNAL, f"{type(exc).__name__}: {exc}")
            )

    def produce(
        self,
        produce: Callable[..., None],
        topic: str,
        value: Any,
        key: Any,
        headers: Any,
        partition: int | None,
        *,
        full: bool = False,
    ) -> None:
        """Produce, serving the producer while its local queue is full (never past a stop:
        a stop leaves the rest uncommitted, to be re-read). `full`: the caller's own
        produce() already found it full (counted here, once per record)."""
        if full:
            self._count_queue_full()
        while True:
            try:
                if partition is None:
                    produce(topic, value, key, headers=headers)
                else:
                    produce(topic, value, key, headers=headers, partition=partition)
                return
            except BufferError:
                if self._stopping.is_set():
                    raise SendLaterError("stopping") from None
                if not full:
                    full = True
                    self._count_queue_full()
                self.poll(QUEUE_FULL_POLL_S)

    def produce_after_full(
        self,
        produce: Callable[..., None],
        topic: str,
        value: Any,
        key: Any,
        headers: Any,
        partition: int | None,
    ) -> None:
        """`produce` for a record whose first produce() found the queue full."""
        self.produce(produce, topic, value, key, headers, partition, full=True)

    def _produce_suspect(
        self,
        spot: Key,
        record: Message,
        target: str,
        headers: Any,
        target_partition: int | None,
    ) -> None:
        callback = functools.partial(self._suspect_report, spot)
        kwargs: dict[str, Any] = {"headers": headers, "on_delivery": callback}
        if target_partition is not None:
            kwargs["partition"] = target_partition
        while True:
            try:
                self._producer.produce(target, record.value(), record.key(), **kwargs)
                return
            except BufferError:
                if self._stopping.is_set():
                    raise SendLaterError("stopping") from None
                self.poll(QUEUE_FULL_POLL_S)

    def _partition_problem(self, envelope: Envelope, count: Any) -> tuple[str, str] | None:
        """The slow side of the local checks: metadata trouble, or a partition out of range."""
        if isinstance(count, KafkaError):
            return (
                permanent_reason(count) or dl.REASON_UNKNOWN_TOPIC,
                f"target topic {envelope.target!r}: {count.str()}",
            )
        assert envelope.partition is not None
        try:  # the topic may have grown since it was cached
            fresh = self._targets.partitions(envelope.target, fresh=True)
        except Exception as exc:
            raise SendLaterError(str(exc)) from exc
        if isinstance(fresh, int) and envelope.partition >= fresh:
            return (
                dl.REASON_UNKNOWN_PARTITION,
                f"partition {envelope.partition} of {envelope.target!r} does not exist "
                f"(it has {fresh})",
            )
        if isinstance(fresh, KafkaError):
            return permanent_reason(fresh) or dl.REASON_UNKNOWN_TOPIC, fresh.str()
        return None

    # -- kept for the forwarder, which calls them by these names ---------------------
    def markers_waiting(self) -> bool:
        return self.route.waiting()

    def serve_markers(self, begin: Callable[[], None]) -> None:
        self.route.serve(begin)

    def dead_letter(self, tp: TP, record: Message, doom: Doom) -> None:
        held_back = self._throttle.allow(("dead-letter", doom.reason))
        if held_back is not None:
            log.warning(
                "dead-lettering %s[%d]@%d: %s (%s)%s%s",
                tp[0],
                tp[1],
                record.offset(),
                doom.reason,
                dl.capped(doom.detail),
                " as a stub" if doom.stub else "",
                f" ({held_back} more with this reason since the last line)" if held_back else "",
            )
        key, value, headers = dead_letter_copy(record, doom, tp[0])
        spot = (tp[0], tp[1], record.offset() or 0)
        self.interval.dead_sent[spot] = doom
        produce = self._producer.produce
        if spot in self.failures.suspects:
            produce = functools.partial(
                produce, on_delivery=functools.partial(self._suspect_report, spot)
            )
        try:
            self.produce(produce, self._dead_letter_topic, value, key, headers, None)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if (
                isinstance(error, KafkaError)
                and error.code() in (KafkaError.MSG_SIZE_TOO_LARGE,)
                and not doom.stub
            ):
                self.dead_letter(tp, record, Doom(doom.reason, doom.detail, stub=True))
                return
            raise

    def _dead_letter_safely(self, tp: TP, record: Message, doom: Doom) -> None:
        """Dead-letter a record whose handling raised; if even that raises, a stub (only
        headers this service writes); failing that, its partition waits and retries."""
        for attempt in (doom, Doom(doom.reason, doom.detail, stub=True)):
            try:
                self.dead_letter(tp, record, attempt)
                return
            except (SendLaterError, ForwarderFatalError):
                raise
            except Exception:
                log.exception("%s: could not dead-letter a record", tp[0])
        self._m_loop_errors.inc()
        raise SendLaterError("the dead letter could not be produced")

    def _refused_now(self, tp: TP, record: Message, exc: KafkaException) -> None:
        """produce() itself refused (a local check: too large, unknown partition...)."""
        error = error_of(exc)
        if error is None:
            raise SendLaterError(str(exc))
        if is_fatal(error):  # produce() refuses with _FATAL, never flagged fatal
            raise producer_failed(error, f"{self.worker}: produce")
        reason = permanent_reason(error)
        if reason is None:
            self._m_errors.labels(self.levels[tp[0]].name, error.name()).inc()
            raise SendLaterError(error.str())
        self._dead_letter_safely(tp, record, Doom(reason, error.str()))
