"""How the forwarder sends one record: forward, re-publish or dead-letter, and the
local checks before it (Kafka's name rule, the target in the metadata cache, the
partition in range; the size limit is librdkafka's own, at produce()).

The happy path has no delivery callback: the level's producer reports only failures,
which `failures.Failures` places at the commit point. Records a report could not be
pinned to (`Failures.suspects`) go again with a callback each. No exception from one
record escapes `send_run`: it is dead-lettered (`internal_error`), or its partition
waits (`SendLaterError`) when it could not be sent now. Precise records
(`Routes.exact`) come with their envelope and due time read when they were admitted.
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
from delayservice.envelope import (
    H_DELAY_MS,
    H_DUE_MS,
    H_ID,
    Envelope,
    Headers,
    forwarded_headers,
    unwrap,
)
from delayservice.errors import DelayServiceError, EnvelopeError
from delayservice.forward import dead_letter as dl
from delayservice.forward import speedups
from delayservice.forward.buffer import TP, Buffer
from delayservice.forward.failures import (
    Doom,
    Failures,
    Key,
    dead_letter_copy,
    permanent_reason,
)
from delayservice.forward.held_record import HeldView, record_of
from delayservice.forward.marker_route import MarkerRoute
from delayservice.forward.open_interval import OpenInterval
from delayservice.forward.target_names import TargetNames
from delayservice.kafka.client_errors import error_of, is_fatal, lost_client_error, raised_by
from delayservice.kafka.record_headers import UNREADABLE, read_headers
from delayservice.kafka.target_topics import TargetTopics
from delayservice.levels import Level, LevelSet, format_duration_ms
from delayservice.log_throttle import Throttle
from delayservice.metrics.service_metrics import ServiceMetrics

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
BELOW_LEVEL: Final = "delay_below_level"
ABOVE_LEVEL: Final = "delay_above_level"
UNREADABLE_DOOM: Final = Doom(dl.REASON_UNREADABLE_HEADERS, dl.UNREADABLE_HEADERS_DETAIL)


@dataclass
class Routes:
    """Where a record whose envelope asks for more than its level goes instead."""

    levels: LevelSet
    precise_topic: str | None
    dead_letter_topic: str
    reserved: frozenset[str]
    exact: bool = False
    """Precise mode: every delay is the record's own, checked when it was read (and its
    records come with their envelope read), so nothing here is re-published or out of
    range."""
    markers: MarkerRoute | None = None
    """Level mode: the worker's side of cancel and reschedule
    (`level.marker_actions.WorkerMarkers`); None where markers are not read."""


class ForwarderFatalError(DelayServiceError):
    """The producer cannot go on: a new one replaces it, or (`fenced`: another live
    instance has its transactional id, or failures keep coming) the daemon stops."""

    def __init__(self, message: str, *, fenced: bool = False) -> None:
        super().__init__(message)
        self.fenced = fenced


FENCED: Final = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED})


def producer_failed(error: KafkaError, what: str) -> ForwarderFatalError:
    """The error for a producer that hit `error` (fatal) while doing `what`."""
    fenced = error.code() in FENCED
    hint = (
        " (a newer producer took its transactional id: another live process with the same "
        "instance_name, or the coordinator ending a transaction left open past its timeout)"
        if fenced
        else ""
    )
    return ForwarderFatalError(f"{what}: {error.str()}{hint}", fenced=fenced)


class SendLaterError(DelayServiceError):
    """A record that cannot be sent now; its partition goes back to the buffer from it."""

    def __init__(self, why: str) -> None:
        super().__init__(why, retriable=True)


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
        self._levels = dict(levels)
        self._previous = {
            topic: 0 if routes.exact else routes.levels.previous_delay_ms(level)
            for topic, level in self._levels.items()
        }
        self._worker = worker
        self.group = group
        self._producer = producer
        self._targets = targets
        self._routes = routes
        self.failures = failures
        self._stopping = stopping
        self._clock = clock
        self._m_errors = metrics.forward_errors
        self._m_loop_errors = metrics.loop_errors.labels(worker, "forwarder")
        self._m_queue_full = {t: metrics.queue_full.labels(lv.name) for t, lv in levels.items()}
        self._m_mismatch = {
            (topic, kind): metrics.level_mismatches.labels(level.name, kind)
            for topic, level in levels.items()
            for kind in (ABOVE_LEVEL, BELOW_LEVEL)
        }
        self._throttle = Throttle()
        self._names = TargetNames(routes.reserved)
        self._interval = interval
        """Where what is sent is noted: re-published, dead-lettered, lateness, failures."""
        self._fast = speedups.fast_path()
        self._sending = ""
        """The delay topic whose run is being sent (what a full queue is counted against)."""

    def _count_queue_full(self) -> None:
        counter = self._m_queue_full.get(self._sending)
        if counter is not None:
            counter.inc()

    def _lateness_of(self, topic: str) -> list[tuple[int, int]]:
        lateness = self._interval.lateness
        kept = lateness.get(topic)
        if kept is None:
            kept = lateness[topic] = []
        return kept

    def replace_producer(self, producer: Any) -> None:
        """Send through `producer` from now on (the old one failed)."""
        self._producer = producer
        self._targets = TargetTopics(producer, clock=self._clock)

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
            failure = producer_failed(error, f"{self._worker}: {what}")
            failure.__cause__ = exc
            return failure
        return exc

    def forget_target(self, topic: str) -> None:
        """The broker says `topic` does not exist: ask again next time."""
        self._targets.forget(topic)

    def on_report(self, error: KafkaError | None, message: Message) -> None:
        """librdkafka's delivery report, failures only; served on the forwarder's thread."""
        if error is not None:
            self._interval.reports.append((error, message, None))

    def _suspect_report(self, spot: Key, error: KafkaError | None, message: Message) -> None:
        """The report of a record sent with a callback of its own (see `Failures.suspects`)."""
        if error is not None:
            self._interval.reports.append((error, message, spot))

    def send_run(self, tp: TP, records: list[Any]) -> int:
        """Send one partition's due records in order; how many went (the rest must wait).

        A `Held` record (its envelope read when it was admitted, `forward.held_record`)
        for a target known to exist is sent as it is, by `fast_path.send_held_run`:
        this runs once per forwarded record. Anything else (a record kept as the
        client's message, a record doomed or suspected by an earlier failure), and
        anything that goes wrong, takes `_send_one`."""
        self._sending = tp[0]
        if self._routes.exact:
            return self._send_held(tp, records)
        markers = self._routes.markers
        if markers is not None:
            marked = markers.screen(tp, records)
            if marked:
                return self._send_screened(tp, records, marked)
        return self._send_plain(tp, records)

    def _send_plain(self, tp: TP, records: list[Any]) -> int:
        failures = self.failures
        return int(
            self._fast.send_held_run(
                tp,
                records,
                self._producer.produce,
                int(self._clock.time() * 1000),
                not failures.doomed and not failures.suspects,
                self._lateness_of(tp[0]),
                self._partition_count,
                self._produce_after_full,
                self._send_one,
                SendLaterError,
                partitioners.place,
            )
        )

    def _send_screened(self, tp: TP, records: list[Any], marked: list[int]) -> int:
        """`send_run` for a run where a marker may concern the records at `marked`: those
        take the full path (`_send_one`, which asks the markers), the rest go as usual."""
        start = 0
        now_ms = int(self._clock.time() * 1000)
        for position in [*marked, len(records)]:
            if position > start:
                sent = self._send_plain(tp, records[start:position])
                if sent < position - start:
                    return start + sent
            if position == len(records):
                break
            try:
                self._send_one(tp, record_of(tp, records[position]), now_ms)
            except SendLaterError:
                return position
            start = position + 1
        return len(records)

    def _partition_count(self, target: str) -> int:
        """The partition count of a valid, existing target, 0 otherwise."""
        return self._known_target(target) or 0

    def _send_held(self, tp: TP, records: list[Any]) -> int:
        """`send_run` for precise records (`SlotRecord`), whose envelope and due time were
        read when they were admitted: the common one (no explicit target partition, a
        known target) is sent as it is; the rest take `_send_one`."""
        produce = self._producer.produce
        lateness = self._lateness_of(tp[0])
        plain = not self.failures.doomed and not self.failures.suspects
        known: dict[str, int] = {}  # target -> its partition count (0: it cannot be sent to)
        now_ms = int(self._clock.time() * 1000)
        for index, record in enumerate(records):
            envelope = record.envelope
            count = 0
            if plain and record.problem is None and envelope is not None:
                count = known.get(envelope.target, -1)
                if count < 0:
                    count = known[envelope.target] = self._partition_count(envelope.target)
                if envelope.partition is not None:
                    count = 0
            try:
                if not count or not self._fast_produce(produce, count, record):
                    self._send_one(tp, record, now_ms)
                    continue
            except SendLaterError:
                return index
            lateness.append((now_ms - record.due_ms, 1))
        return len(records)

    def _fast_produce(self, produce: Callable[..., None], count: int, record: Any) -> bool:
        """Produce a precise record's forward to its target (of `count` partitions), on
        the partition its producer's partitioner gives its key; False when produce()
        raised something a full queue does not explain, at once or while it waited for
        room (`_send_one` then says what it was). Raises only what waiting raises to
        stop the run."""
        envelope = record.envelope
        target = envelope.target
        key = record.key()
        placed = partitioners.place(envelope.partitioner, key, count)
        headers = forwarded_headers(record.user, envelope, record.due_ms)
        try:
            partition = ANY_PARTITION if placed is None else placed
            produce(target, record.value(), key, partition, None, None, 0, headers)
        except BufferError:
            try:
                self._produce_after_full(produce, target, record.value(), key, headers, placed)
            except (SendLaterError, ForwarderFatalError):
                raise
            except Exception:
                return False
        except Exception:
            return False
        return True

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

    def _send_one(self, tp: TP, record: Any, now_ms: int) -> None:  # noqa: PLR0912, PLR0915
        """Everything but the common case: the full envelope check, re-publishing,
        dead letters, records sent with a callback of their own. Raises only
        `SendLaterError` (and `ForwarderFatalError`)."""
        level = self._levels[tp[0]]
        try:
            due = self.group.due_of(tp, record)
            spot = (tp[0], tp[1], record.offset() or 0)
            doom = self.failures.doomed.get(spot)
            if doom is not None:
                self._dead_letter(tp, record, doom)
                return
            exact = self._routes.exact
            if exact and record.problem is not None:  # found when the record was read
                self._dead_letter(tp, record, Doom(*record.problem))
                return
            if not exact and read_headers(record) is UNREADABLE:
                self._dead_letter(tp, record, UNREADABLE_DOOM)
                return
            envelope, user = self._envelope(record)
            marked_due = self._marked(tp, record, envelope, due)
            if marked_due is None:
                return  # a marker withdrew it, or moved it: nothing to forward
            due = marked_due
            target = envelope.target
            problem = self._names.problem(target) or (
                None if exact else self._out_of_range(envelope, due, level)
            )
            if problem is None:
                count = self._targets.partitions(target)
                if type(count) is not int or (
                    envelope.partition is not None and envelope.partition >= count
                ):
                    problem = self._partition_problem(envelope, count)
            if problem is not None:  # decided here, where it was read, not after a re-publish
                self._dead_letter(tp, record, Doom(*problem))
                return
            partition = self._partition_of(envelope, record.key(), count)
            if not exact and (
                envelope.delay_ms > level.delay_ms
                or (envelope.due_ms is not None and envelope.due_ms > due)
            ):
                self._reroute(tp, record, envelope, due, level)
                return
            if not exact and envelope.delay_ms <= self._previous[tp[0]]:
                self._mismatch(tp[0], BELOW_LEVEL)
            user.append((H_ID, envelope.id.encode()))
            user.append((H_DUE_MS, str(due).encode()))
            if spot in self.failures.suspects:
                self._produce_suspect(spot, record, target, user, partition)
            else:
                self._produce(
                    self._producer.produce, target, record.value(), record.key(), user, partition
                )
            self._lateness_of(tp[0]).append((now_ms - due, 1))
        except EnvelopeError as exc:
            self._dead_letter_safely(tp, record, Doom(dl.REASON_ENVELOPE, str(exc)))
        except (SendLaterError, ForwarderFatalError):
            raise
        except DelayServiceError as exc:  # metadata could not be fetched: wait, retry
            self._m_errors.labels(level.name, "metadata").inc()
            if self._throttle.allow("metadata") is not None:
                log.warning("%s: %s; retrying", tp[0], exc)
            raise SendLaterError(str(exc)) from exc
        except KafkaException as exc:
            self._refused_now(tp, record, exc)
        except Exception as exc:
            if lost_client_error(exc):  # a producer call, not this record: it goes again
                raise SendLaterError("a producer call lost its error") from exc
            log.exception(
                "%s[%d]@%d: unexpected error while forwarding", tp[0], tp[1], record.offset()
            )
            self._dead_letter_safely(
                tp, record, Doom(dl.REASON_INTERNAL, f"{type(exc).__name__}: {exc}")
            )

    def _marked(self, tp: TP, record: Any, envelope: Envelope, due: int) -> int | None:
        """The due time to forward `record` with, as its id's markers decide (None:
        withdrawn or moved); `due` when no marker names it."""
        markers = self._routes.markers
        if markers is None:
            return due
        if type(record) is not HeldView:
            markers.recall(tp, record)  # a copy a move made: its markers must be at hand
        if not markers.has(envelope.id):
            return due
        decided: int | None = markers.decide(tp, record, envelope, due, self)
        return decided

    def _envelope(self, record: Any) -> tuple[Envelope, Headers]:
        """A record's envelope and the user's headers (a copy, to append to). Precise
        records were read when they were admitted; a level's are read here."""
        if self._routes.exact:
            return record.envelope, list(record.user)
        headers = read_headers(record)
        if type(headers) is not list:  # the client gives a list, or None
            headers = list(headers.items()) if isinstance(headers, dict) else None
        envelope, user, _ = unwrap(headers)
        return envelope, user

    def _produce(
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

    def _produce_after_full(
        self,
        produce: Callable[..., None],
        topic: str,
        value: Any,
        key: Any,
        headers: Any,
        partition: int | None,
    ) -> None:
        """`_produce` for a record whose first produce() found the queue full."""
        self._produce(produce, topic, value, key, headers, partition, full=True)

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

    def _mismatch(self, topic: str, kind: str) -> None:
        self._m_mismatch[(topic, kind)].inc()
        if self._throttle.allow((topic, kind)) is not None:
            log.warning(
                "%s (level %s): envelopes %s; check that producers and daemons use the same "
                "levels (metric delayservice_level_mismatches_total)",
                topic,
                self._levels[topic].name,
                "belong to a shorter level; delivered late"
                if kind == BELOW_LEVEL
                else "ask for more than the level; re-published where they fit",
            )

    def _out_of_range(self, envelope: Envelope, due: int, level: Level) -> tuple[str, str] | None:
        """A delay longer than the longest level: no level may hold it (never early)."""
        longest = self._routes.levels.max_delay_ms
        base = due - level.delay_ms
        if envelope.delay_ms > longest or (
            envelope.due_ms is not None and envelope.due_ms > base + longest
        ):
            return (
                dl.REASON_DELAY_OUT_OF_RANGE,
                f"delay-ms {envelope.delay_ms} / delay-due-ms {envelope.due_ms} is beyond "
                f"the longest delay held here ({format_duration_ms(longest)})",
            )
        return None

    def _reroute(self, tp: TP, record: Message, envelope: Envelope, due: int, level: Level) -> None:
        """Re-publish a record whose envelope's floor is later than its level's due time,
        once, with its absolute due time, to where the rest of its wait fits: the
        precise topic (delay-ms 0, so the absolute due time alone decides: exact), or
        the smallest level that holds what remains (delay-ms is what remains: never
        early, late by at most the gap between two levels)."""
        base = due - level.delay_ms
        target_due = max(base + envelope.delay_ms, envelope.due_ms or 0, due)
        routes = self._routes
        self._mismatch(tp[0], ABOVE_LEVEL)
        remaining = max(0, target_due - int(self._clock.time() * 1000))
        if routes.precise_topic is not None:
            topic, delay_ms = routes.precise_topic, 0
        else:
            topic, delay_ms = routes.levels.select(max(1, remaining)).topic, remaining
        extra = [(H_DELAY_MS, str(delay_ms).encode()), (H_DUE_MS, str(target_due).encode())]
        self.republish(tp, record, topic, None, extra)
        self._interval.rerouted[(tp[0], tp[1], record.offset() or 0)] = topic

    def republish(
        self,
        tp: TP,
        record: Any,
        topic: str,
        partition: int | None,
        extra: list[tuple[str, Any]],
        on_delivery: Callable[[Any, Any], None] | None = None,
    ) -> None:
        """Produce `record` again to the delay topic `topic` (on `partition`, or where
        the producer puts it), its headers' `extra` names replaced by `extra`; a failure
        goes to `on_delivery` when given, else to the interval's failures."""
        raw = read_headers(record)
        names = {name for name, _ in extra}
        headers = [(n, v) for n, v in (raw if isinstance(raw, list) else []) if n not in names]
        headers.extend(extra)
        produce = self._producer.produce
        if on_delivery is not None:
            produce = functools.partial(produce, on_delivery=on_delivery)
        self._produce(produce, topic, record.value(), record.key(), headers, partition)

    # -- what the markers of level mode ask of the sender (`level.marker_actions`) --------
    def withdraw(self, spot: Key, outcome: str) -> None:
        """A marker withdrew this record: it goes nowhere, and its offset commits."""
        self._interval.withdrawn[spot] = outcome

    def rerouted(self, spot: Key, topic: str) -> None:
        self._interval.rerouted[spot] = topic

    def partition_count(self, topic: str) -> int:
        """The partition count of a topic (a level's), or `DelayServiceError`."""
        count = self._targets.partitions(topic)
        if type(count) is not int:
            raise DelayServiceError(f"cannot place a copy on {topic}: {count}", retriable=True)
        return count

    def envelope_of(self, record: Any) -> Envelope | None:
        """A queued record's envelope, None when it has none that reads."""
        try:
            return self._envelope(record)[0]
        except (EnvelopeError, TypeError):
            return None

    def answer(
        self, topic: str, value: bytes, key: bytes, on_delivery: Callable[[Any, Any], None]
    ) -> None:
        """Produce an answer to a marker (in the open transaction, exactly-once)."""
        produce = functools.partial(self._producer.produce, on_delivery=on_delivery)
        self._produce(produce, topic, value, key, None, None)

    def markers_waiting(self) -> bool:
        markers = self._routes.markers
        return markers is not None and bool(markers.waiting())

    def serve_markers(self, begin: Callable[[], None]) -> None:
        """Answer new markers and move their messages now, where they are queued here
        (`begin` runs before the first thing it produces). A failure leaves them for the
        next pass."""
        markers = self._routes.markers
        if markers is None:
            return
        try:
            markers.serve(self, begin)
        except (SendLaterError, DelayServiceError, KafkaException) as exc:
            if self._throttle.allow("markers") is not None:
                log.warning("%s: markers wait: %s", self._worker, exc)

    def _dead_letter(self, tp: TP, record: Message, doom: Doom) -> None:
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
        self._interval.dead_sent[spot] = doom
        produce = self._producer.produce
        if spot in self.failures.suspects:
            produce = functools.partial(
                produce, on_delivery=functools.partial(self._suspect_report, spot)
            )
        try:
            self._produce(produce, self._routes.dead_letter_topic, value, key, headers, None)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if (
                isinstance(error, KafkaError)
                and error.code() in (KafkaError.MSG_SIZE_TOO_LARGE,)
                and not doom.stub
            ):
                self._dead_letter(tp, record, Doom(doom.reason, doom.detail, stub=True))
                return
            raise

    def _dead_letter_safely(self, tp: TP, record: Message, doom: Doom) -> None:
        """Dead-letter a record whose handling raised; if even that raises, a stub (only
        headers this service writes); failing that, its partition waits and retries."""
        for attempt in (doom, Doom(doom.reason, doom.detail, stub=True)):
            try:
                self._dead_letter(tp, record, attempt)
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
            raise producer_failed(error, f"{self._worker}: produce")
        reason = permanent_reason(error)
        if reason is None:
            self._m_errors.labels(self._levels[tp[0]].name, error.name()).inc()
            raise SendLaterError(error.str())
        self._dead_letter_safely(tp, record, Doom(reason, error.str()))
