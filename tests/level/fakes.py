"""Small fakes behind the client seam, and a rig that wires a level worker to them
(precise mode's forwarding rig, in `tests/precise/forward_rig.py`, uses them too).

`FakeConsumer` models what the consumer loop relies on: a log per partition read from
a position, pause/resume (remembered across re-assignment, as librdkafka does), seek,
rebalance callbacks and commit results served from inside `consume` (on the loop's
thread, as librdkafka serves them from poll), and commits whose outcome a test decides.

`FakeProducer` keeps every produce, checks headers the way confluent-kafka does, and
holds delivery reports until `poll`/`flush`/`deliver` serves them, each with the
outcome a test decides. Either fake can raise on demand (BufferError for a full queue,
KafkaException, anything unexpected). Like librdkafka (rdkafka_msg.c
`rd_kafka_check_produce`, rdkafka_txnmgr.c) and confluent-kafka 2.16 over it, the fake
producer refuses `produce()` with `_STATE` once a failed delivery has made its
transaction abortable, until the abort; serves, from `abort_transaction`, a
`_PURGE_QUEUE` report for every record still queued (tests/kafka/test_transaction_purge.py);
never reports a delivery as fatal; and, once a
test makes it fatal (`go_fatal`), purges its queue (`_PURGE_QUEUE` reports), raises the
fatal error once from the next `poll()`/`flush()` (confluent-kafka raises a fatal error
event there instead of calling `error_cb`), refuses every `produce()` with `_FATAL`
(not flagged fatal) and every transaction call with the fatal error.

`FakeClock` stands in for the forwarder's clock, so due times, backoffs and give-up
windows are tested without sleeping.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from prometheus_client import CollectorRegistry

from delayservice.envelope import Envelope
from delayservice.forward import dead_letter as dead_letter_module
from delayservice.forward.forwarder import Forwarder
from delayservice.kafka.broker_clock import MAX_HOLD_BACK_S, BrokerClock
from delayservice.kafka.target_topics import TargetTopics
from delayservice.kafka.unconfirmed_acks import watch_unconfirmed
from delayservice.level import consumer_loop as consumer_loop_module
from delayservice.level import rebalance_callbacks as rebalance_callbacks_module
from delayservice.level import record_admission as record_admission_module
from delayservice.level import start_offsets as start_offsets_module
from delayservice.level.consumer_loop import ConsumerLoop
from delayservice.level.flow_control import FlowControl
from delayservice.level.level_route import level_routes
from delayservice.level.markers.actions import LEAD_MS, WorkerMarkers
from delayservice.level.markers.book import MarkerBook
from delayservice.level.markers.gate import MarkerGate
from delayservice.level.memory_budget import MemoryBudget
from delayservice.level.partition_group import PartitionGroup
from delayservice.levels import Level, LevelSet
from delayservice.metrics.service_metrics import ServiceMetrics

LEVEL_TOPIC = "delay_topic_2"
LEVEL = Level(2, 5_000, LEVEL_TOPIC)
PREVIOUS_DELAY_MS = 1_000
MAX_DELAY_MS = 60_000
DLQ = "delay-dead-letters"
OUTCOMES = "delay_markers_outcomes"
TARGET = "orders"
OTHER_TARGET = "payments"


# -- time ---------------------------------------------------------------------------
class FakeClock:
    """`time.time` and `time.monotonic`, moved only by `advance` (thread-safe).

    Kept in whole microseconds so that many small steps add up exactly."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._wall_us = round(start * 1_000_000)
        self._mono_us = 10_000 * 1_000_000
        self._lock = threading.Lock()

    def time(self) -> float:
        with self._lock:
            return self._wall_us / 1_000_000

    def monotonic(self) -> float:
        with self._lock:
            return self._mono_us / 1_000_000

    def ms(self) -> int:
        with self._lock:
            return self._wall_us // 1000

    def advance(self, seconds: float) -> None:
        step = round(seconds * 1_000_000)
        with self._lock:
            self._wall_us += step
            self._mono_us += step


CLOCKED_MODULES = (
    dead_letter_module,
    consumer_loop_module,
    record_admission_module,
    rebalance_callbacks_module,
    start_offsets_module,
)
"""The modules of the level rig that read `time`, which a FakeClock stands in for."""


# -- records ------------------------------------------------------------------------
def envelope_headers(
    target: str = TARGET,
    delay_ms: int = LEVEL.delay_ms,
    message_id: str = "id-0",
    partition: int | None = None,
    user: Iterable[tuple[str, Any]] = (),
) -> list[tuple[str, Any]]:
    return [*user, *Envelope(target, delay_ms, message_id, partition).headers()]


_ENVELOPE: Any = object()


def message(
    partition: int,
    offset: int,
    timestamp_ms: int,
    *,
    headers: Any = _ENVELOPE,
    key: Any = b"k",
    value: Any = b"v",
    timestamp_type: int = TIMESTAMP_LOG_APPEND_TIME,
    topic: str = LEVEL_TOPIC,
    error: KafkaError | None = None,
) -> Message:
    """A record as the consumer returns it; a valid envelope by default, with the id
    `id-P-O` (on another topic than the level's, `id-TOPIC-P-O`)."""
    if headers is _ENVELOPE:
        where = f"{partition}" if topic == LEVEL_TOPIC else f"{topic}-{partition}"
        mid = f"id-{where}-{offset}"
        headers = envelope_headers(message_id=mid)
    return Message(
        topic=topic,
        partition=partition,
        offset=offset,
        key=key,
        value=value,
        headers=headers,
        timestamp=(timestamp_type, timestamp_ms),
        error=error,
    )


def raise_bare_kafka_error(error: KafkaError) -> None:
    """Raise `error` itself, a `KafkaError`, which is not an exception class, the way
    confluent-kafka 2.16.1's `Producer.flush` did when a takeover fenced its producer
    beside CPU hogs (a daemon's log: `confluent_kafka.cimpl.KafkaError: KafkaError{FATAL,
    code=_FENCED,...}` ended the forwarder's thread). `PyErr_Restore` sets any object as
    the exception, as the client's C code does; ctypes raises it on return. Only a bare
    `except:` catches it."""
    kind = ctypes.py_object(type(error))
    value = ctypes.py_object(error)
    ctypes.pythonapi.Py_IncRef(kind)  # PyErr_Restore steals both references
    ctypes.pythonapi.Py_IncRef(value)
    ctypes.pythonapi.PyErr_Restore(kind, value, None)


class ErrorTopicPartition(TopicPartition):
    """A TopicPartition whose `.error` is set, as commit results carry per partition."""

    def __init__(self, topic: str, partition: int, offset: int, error: KafkaError) -> None:
        super().__init__(topic, partition, offset)
        self._error = error

    @property
    def error(self) -> KafkaError:  # type: ignore[override]
        return self._error


def header(headers: Iterable[tuple[str, Any]] | None, name: str) -> Any:
    """The value of the one header called `name` (fails if there are several)."""
    values = [v for n, v in headers or () if n == name]
    assert len(values) <= 1, f"{name} appears {len(values)} times"
    return values[0] if values else None


# -- consumer -----------------------------------------------------------------------
TP = tuple[str, int]
CommitOutcome = Callable[[list[TopicPartition]], tuple[KafkaError | None, list[TopicPartition]]]


def commit_ok(offsets: list[TopicPartition]) -> tuple[KafkaError | None, list[TopicPartition]]:
    return None, [TopicPartition(tp.topic, tp.partition, tp.offset) for tp in offsets]


@dataclass
class FakeGroup:
    """The group coordinator's side of one consumer group that several members' fake
    consumers share (`FakeConsumer.group`): its generation moves when the group
    rebalances, before a member hears of it at its next consume(). A member behind it
    has its offsets refused (`ILLEGAL_GENERATION`), a consumer commit and a
    transaction's alike, as the coordinator refuses an OffsetCommit or a TxnOffsetCommit
    of a past generation."""

    generation: int = 0


class FakeConsumer:
    """Keyed by (topic, partition) inside; a test names a partition of the first topic by
    its number alone, and reads the first topic's state through the int-keyed views
    (`committed_offsets`, `paused`, `assigned`, `commits`, `seeks`, `pauses`,
    `resumes`)."""

    def __init__(self, topic: str = LEVEL_TOPIC, *more_topics: str) -> None:
        self.topic = topic
        self.topics = [topic, *more_topics]
        self.config: dict[str, Any] = {}
        self.rebalance: dict[str, Callable[[Any, list[TopicPartition]], None]] = {}
        self.logs: dict[TP, list[Message]] = {}
        self.positions: dict[TP, int] = {}
        self.assigned_tps: set[TP] = set()
        self.paused_tps: set[TP] = set()  # kept across re-assignment, like librdkafka
        self.slow_tps: set[TP] = set()
        """Partitions whose records do not arrive for now (a slow fetch), paused or not."""
        self.committed_tps: dict[TP, int] = {}  # what the "broker" accepted
        self.commits_tps: list[tuple[bool, list[tuple[TP, int]]]] = []  # (async?, offsets)
        self.seeks_tps: list[tuple[TP, int]] = []
        self.pauses_tps: list[list[TP]] = []
        self.resumes_tps: list[list[TP]] = []
        self.commit_outcome: CommitOutcome = commit_ok
        self.commit_raises: KafkaException | None = None  # for synchronous commits
        self.injected: deque[Message] = deque()  # returned ahead of the logs (errors)
        self.closed = False
        self.blocking = True  # False: consume() ignores its timeout (tests on one thread)
        self.consume_calls = 0
        self.generation: dict[TP, int] = {}  # partition -> its current assignment's number
        self.fetch_loses_offsets = False
        """librdkafka's own fetch on assignment starting from `auto.offset.reset` (the
        beginning), as seen when a rebalance came in while committed offsets were
        unstable; only an explicit `incremental_assign` offset avoids it."""
        self.unstable_answers = 0  # committed() calls that time out (a pending transaction)
        self.fatal_error: KafkaError | None = None
        """Set by `go_fatal`, cleared by `make` (a new client is not fatal)."""
        self.committed_calls = 0
        self.explicit_starts: list[tuple[int, int]] = []
        self.partition_counts: dict[str, int] = {}
        """What `list_topics` says each topic has (a topic not named here: none)."""
        self.metadata_seen: dict[str, int] | None = None
        """Set to a dict, the partitions this client learnt of by its own `list_topics`:
        like librdkafka's metadata cache, `get_watermark_offsets` on a partition of
        `partition_counts` beyond them fails with `_UNKNOWN_PARTITION`."""
        self.manual = False
        """Assigned by `assign` (no group): `incremental_assign` adds partitions, as
        librdkafka's does outside a rebalance."""
        self.read_in: dict[tuple[TP, int], int] = {}  # (partition, offset) -> read under
        self._generations = 0
        self.group_generation = 0
        """The group's generation: every rebalance this member takes part in moves it, and
        the metadata `consumer_group_metadata` gives carries it. A transaction's offsets
        sent with an older one are refused, as the group coordinator refuses a
        TxnOffsetCommit of a past generation (KIP-447)."""
        self.group: FakeGroup | None = None
        """Set, the group this member shares with others: `group_generation` is then the
        generation it joined last (at the rebalance it served last), and the group's own
        is the current one."""
        self._events: deque[tuple[str, list[TP]]] = deque()
        self._reports: deque[tuple[KafkaError | None, list[TopicPartition]]] = deque()
        self._cond = threading.Condition()

    def tp(self, partition: int | TP) -> TP:
        """A partition number of the first topic, or a (topic, partition) as it is."""
        return partition if isinstance(partition, tuple) else (self.topic, partition)

    def _first(self, tps: Iterable[TP]) -> list[int]:
        return [p for t, p in tps if t == self.topic]

    # -- int-keyed views of the first topic --------------------------------------------
    @property
    def committed_offsets(self) -> dict[int, int]:
        return {p: o for (t, p), o in self.committed_tps.items() if t == self.topic}

    @property
    def assigned(self) -> set[int]:
        return set(self._first(self.assigned_tps))

    @property
    def paused(self) -> set[int]:
        return set(self._first(self.paused_tps))

    @property
    def commits(self) -> list[tuple[bool, list[tuple[int, int]]]]:
        return [
            (asynchronous, [(tp[1], o) for tp, o in offsets if tp[0] == self.topic])
            for asynchronous, offsets in self.commits_tps
        ]

    @property
    def seeks(self) -> list[tuple[int, int]]:
        return [(tp[1], o) for tp, o in self.seeks_tps if tp[0] == self.topic]

    @property
    def pauses(self) -> list[list[int]]:
        return [self._first(tps) for tps in self.pauses_tps]

    @property
    def resumes(self) -> list[list[int]]:
        return [self._first(tps) for tps in self.resumes_tps]

    # The loop's MakeConsumer: receives error_cb and on_commit.
    def make(self, config: dict[str, Any]) -> FakeConsumer:
        self.config = config
        if self.fatal_error is not None:  # the failed client's queue goes with it
            gone = self.fatal_error
            self.injected = deque(m for m in self.injected if m.error() is not gone)
            self.fatal_error = None
        return self

    def go_fatal(self) -> None:
        """librdkafka's own thread setting the fatal error (a static member fenced by
        another with its `group.instance.id`), as probed on a real broker: the next
        `consume()` returns it as an error message; `committed()` times out (the fenced
        client has dropped its coordinator); every commit is refused with `_FATAL`."""
        with self._cond:
            self.fatal_error = KafkaError(
                KafkaError._FATAL,
                "Fatal error: Broker: Static consumer fenced by other consumer with same "
                "group.instance.id",
                fatal=True,
            )
            self.injected.append(message(0, 0, 0, topic=self.topic, error=self.fatal_error))
            self._cond.notify_all()

    # -- test controls ---------------------------------------------------------------
    def append(self, partition: int | TP, *messages: Message) -> None:
        with self._cond:
            self.logs.setdefault(self.tp(partition), []).extend(messages)
            self._cond.notify_all()

    def next_offset(self, partition: int | TP) -> int:
        return len(self.logs.get(self.tp(partition), []))

    def queue_rebalance(self, kind: str, *partitions: int | TP) -> None:
        """Fire on_assign / on_revoke / on_lost from inside the next consume()."""
        with self._cond:
            self._events.append((kind, [self.tp(p) for p in partitions]))
            self._cond.notify_all()

    def expire(self, *partitions: int | TP) -> None:
        """The member's session expired (a process starved or frozen past it): the group
        has moved on and given `partitions` to another member, and this one learns it
        only from a later consume(), as librdkafka does (`on_lost`). Until then its
        threads go on, and what they commit of those partitions is a zombie's."""
        with self._cond:
            if self.group is not None:
                self.group.generation += 1
            else:
                self.group_generation += 1
            for partition in partitions:
                self.generation.pop(self.tp(partition), None)
            self._events.append(("lost", [self.tp(p) for p in partitions]))
            self._cond.notify_all()

    # -- ConsumerClient ----------------------------------------------------------------
    def subscribe(
        self,
        topics: list[str],
        on_assign: Any = None,
        on_revoke: Any = None,
        on_lost: Any = None,
    ) -> None:
        assert sorted(topics) == sorted(self.topics)
        self.rebalance = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        self.consume_calls += 1
        self._serve_callbacks()
        out = self._take(num_messages)
        if not out and self.blocking and timeout and timeout > 0:
            with self._cond:
                if not self._ready():
                    self._cond.wait(timeout)
            self._serve_callbacks()
            out = self._take(num_messages)
        return out

    def pause(self, partitions: list[TopicPartition]) -> None:
        with self._cond:
            tps = [(tp.topic, tp.partition) for tp in partitions]
            self.pauses_tps.append(tps)
            self.paused_tps.update(tps)

    def resume(self, partitions: list[TopicPartition]) -> None:
        with self._cond:
            tps = [(tp.topic, tp.partition) for tp in partitions]
            self.resumes_tps.append(tps)
            self.paused_tps.difference_update(tps)
            self._cond.notify_all()

    def seek(self, partition: TopicPartition) -> None:
        with self._cond:
            tp = (partition.topic, partition.partition)
            assert tp in self.assigned_tps, "seek on an unassigned partition"
            self.seeks_tps.append((tp, partition.offset))
            offset = 0 if partition.offset == OFFSET_BEGINNING else partition.offset
            self.positions[tp] = offset

    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: bool = True
    ) -> list[TopicPartition] | None:
        with self._cond:
            # librdkafka refuses these before it looks at anything else: a fatal client,
            # then no valid offset (nothing is sent)
            refused = self._refused_commit(offsets)
            if refused is not None:
                if asynchronous:
                    self._reports.append((refused, offsets))
                    return None
                raise KafkaException(refused)
            self.commits_tps.append(
                (asynchronous, [((tp.topic, tp.partition), tp.offset) for tp in offsets])
            )
            if not asynchronous and self.commit_raises is not None:
                raise self.commit_raises
            if self.current_generation() != self.group_generation:
                error, results = KafkaError(KafkaError.ILLEGAL_GENERATION), offsets
            else:
                error, results = self.commit_outcome(offsets)
            if error is None:
                for tp in results:
                    if tp.error is None:
                        self.committed_tps[(tp.topic, tp.partition)] = tp.offset
            if asynchronous:
                self._reports.append((error, results))  # served by the next consume()
                return None
        if error is not None:
            raise KafkaException(error)
        return results

    def assign(self, partitions: list[TopicPartition]) -> None:
        """A manual assignment (no group), replacing any before, from the offsets given."""
        with self._cond:
            self.manual = True
            self.assigned_tps = {(tp.topic, tp.partition) for tp in partitions}
            for tp in partitions:
                key = (tp.topic, tp.partition)
                self.positions[key] = 0 if tp.offset == OFFSET_BEGINNING else tp.offset
            self._cond.notify_all()

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        """Called from on_assign (or, under a manual assignment, anywhere: it adds the
        partitions): the partitions start where the caller says."""
        with self._cond:
            for tp in partitions:
                key = (tp.topic, tp.partition)
                if self.manual:
                    assert key not in self.assigned_tps, "adding a partition already assigned"
                    self.assigned_tps.add(key)
                assert key in self.assigned_tps, "assigning a partition not given"
                offset = 0 if tp.offset == OFFSET_BEGINNING else tp.offset
                if tp.topic == self.topic:
                    self.explicit_starts.append((tp.partition, tp.offset))
                self.positions[key] = offset

    def _refused_commit(self, offsets: list[TopicPartition]) -> KafkaError | None:
        if self.fatal_error is not None:
            return KafkaError(KafkaError._FATAL, "Commit failed: Local: Fatal error")
        if not any(tp.offset >= 0 for tp in offsets):
            return KafkaError(KafkaError._NO_OFFSET, "Commit failed: Local: No offset stored")
        return None

    def committed(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        """What the "broker" holds for the group: consumer commits and, in exactly-once,
        the offsets of committed transactions (`FakeProducer.owner`). While
        `unstable_answers` lasts, the call times out as librdkafka's does while a
        transaction holds the offsets."""
        with self._cond:
            self.committed_calls += 1
            if self.fatal_error is not None:
                raise KafkaException(
                    KafkaError(KafkaError._TIMED_OUT, "Failed to get committed offsets")
                )
            if self.unstable_answers > 0:
                self.unstable_answers -= 1
                raise KafkaException(
                    KafkaError(KafkaError._TIMED_OUT, "Failed to get committed offsets")
                )
            return [
                TopicPartition(
                    tp.topic,
                    tp.partition,
                    self.committed_tps.get((tp.topic, tp.partition), -1001),
                )
                for tp in partitions
            ]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        with self._cond:
            return [
                TopicPartition(
                    tp.topic, tp.partition, self.positions.get((tp.topic, tp.partition), -1001)
                )
                for tp in partitions
            ]

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        seen = self.metadata_seen
        if (
            seen is not None
            and partition.topic in self.partition_counts
            and partition.partition >= seen.get(partition.topic, 0)
        ):
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        return 0, self.next_offset((partition.topic, partition.partition))

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        def meta(name: str) -> Any:
            count = self.partition_counts.get(name, 0)
            partitions = {p: SimpleNamespace(id=p) for p in range(count)}
            return SimpleNamespace(partitions=partitions, error=None)

        if self.metadata_seen is not None:
            for name in [topic] if topic is not None else self.partition_counts:
                self.metadata_seen[name] = self.partition_counts.get(name, 0)
        return SimpleNamespace(topics={t: meta(t) for t in [*self.topics, *self.partition_counts]})

    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        """Per partition, the first offset appended at or after the time asked (its
        `offset`), or -1 when none is."""
        with self._cond:
            out = []
            for tp in partitions:
                log = self.logs.get((tp.topic, tp.partition), [])
                found = next((n for n, m in enumerate(log) if m.timestamp()[1] >= tp.offset), -1)
                out.append(TopicPartition(tp.topic, tp.partition, found))
            return out

    def consumer_group_metadata(self) -> Any:
        return ("group-metadata", self.topic, self.group_generation)

    def current_generation(self) -> int:
        """The generation the coordinator takes offsets of: the shared group's, else the
        one this member joined last."""
        return self.group.generation if self.group is not None else self.group_generation

    def close(self) -> None:
        self.closed = True

    # -- internals ---------------------------------------------------------------------
    def _ready(self) -> bool:
        if self._events or self._reports or self.injected:
            return True
        return any(
            self.positions.get(tp, 0) < len(self.logs.get(tp, []))
            for tp in self.assigned_tps - self.paused_tps - self.slow_tps
        )

    def _serve_callbacks(self) -> None:
        """Rebalances and commit results run on the caller's thread, outside the lock."""
        while True:
            with self._cond:
                report = self._reports.popleft() if self._reports else None
            if report is None:
                break
            on_commit = self.config.get("on_commit")
            if on_commit is not None:
                on_commit(*report)
        while True:
            with self._cond:
                if not self._events:
                    return
                kind, tps = self._events.popleft()
                self.group_generation = (
                    self.group.generation if self.group is not None else self.group_generation + 1
                )
                if kind == "assign":
                    for tp in tps:
                        self.assigned_tps.add(tp)
                        self.positions[tp] = (
                            0 if self.fetch_loses_offsets else self.committed_tps.get(tp, 0)
                        )
                        self._generations += 1
                        self.generation[tp] = self._generations
            callback = self.rebalance.get(kind)
            try:
                if callback is not None:
                    callback(self, [TopicPartition(*tp) for tp in tps])
            finally:
                # confluent-kafka's Consumer_rebalance_cb unassigns itself when the
                # callback did not (it raised, too); the exception then leaves consume().
                if kind in ("revoke", "lost"):
                    with self._cond:
                        self.assigned_tps.difference_update(tps)
                        for tp in tps:
                            self.generation.pop(tp, None)

    def _take(self, limit: int) -> list[Message]:
        out: list[Message] = []
        with self._cond:
            while self.injected and len(out) < limit:
                out.append(self.injected.popleft())
            for tp in sorted(self.assigned_tps - self.paused_tps - self.slow_tps):
                log = self.logs.get(tp, [])
                while self.positions.get(tp, 0) < len(log) and len(out) < limit:
                    out.append(log[self.positions[tp]])
                    self.read_in[(tp, self.positions[tp])] = self.generation.get(tp, 0)
                    self.positions[tp] += 1
        return out


# -- producer -----------------------------------------------------------------------
@dataclass(eq=False)
class Sent:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, Any]]
    partition: int | None
    on_delivery: Callable[[Any, Any], None] | None
    at: float
    """Clock time of the produce call."""
    result: KafkaError | None = field(default=None)
    lost: bool = field(default=False)
    """Reported delivered by inference but never written (a re-created partition)."""
    purged: bool = field(default=False)
    """Still queued when the producer went fatal: reported `_PURGE_QUEUE`."""

    def header(self, name: str) -> Any:
        return header(self.headers, name)

    @property
    def delay_id(self) -> str | None:
        raw = self.header("delay-id")
        return raw.decode() if isinstance(raw, bytes) else raw


def _check_headers(headers: Any) -> list[tuple[str, Any]]:
    """What confluent-kafka's produce() accepts, with the errors it raises otherwise."""
    out: list[tuple[str, Any]] = []
    for item in headers or []:
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError("Headers are expected to be a list of (key, value) tuples")
        name, value = item
        if not isinstance(name, str):
            raise TypeError(f"expected header name to be a string, not {type(name).__name__}")
        name.encode()
        if isinstance(value, str):
            value.encode()  # UnicodeEncodeError for lone surrogates, as the real client
        elif value is not None and not isinstance(value, bytes):
            raise TypeError(
                "expected header value to be None, binary, or unicode string, "
                f"not {type(value).__name__}"
            )
        out.append((name, value))
    return out


def _source_of(sent: Sent) -> tuple[TP, int] | None:
    """The level record a forward or dead letter came from: its `dlq-origin-*` headers,
    or the default id (`id-P-O`, `id-TOPIC-P-O`) that `message` gives."""
    origin = (
        sent.header("dlq-origin-topic"),
        sent.header("dlq-origin-partition"),
        sent.header("dlq-origin-offset"),
    )
    if origin[0] is not None and origin[1] is not None and origin[2] is not None:
        return (origin[0].decode(), int(origin[1])), int(origin[2])
    parts = (sent.delay_id or "").split("-")
    if parts[0] != "id" or not all(part.isdigit() for part in parts[-2:]):
        return None
    if len(parts) == 3:
        return (LEVEL_TOPIC, int(parts[1])), int(parts[2])
    if len(parts) == 4:
        return (parts[1], int(parts[2])), int(parts[3])
    return None


class FakeProducer:
    """Delivery reports wait in a queue until poll/flush (or `deliver`) serves them.

    `outcome(sent)` decides each report (None = acknowledged); `on_produce(sent)` runs
    inside produce() and may raise (BufferError = queue full, KafkaException, anything).
    """

    def __init__(
        self,
        topics: dict[str, int] | None = None,
        clock: FakeClock | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.config = dict(config or {})
        self.dr_cb: Callable[[Any, Any], None] | None = self.config.get("on_delivery")
        self.only_error = bool(self.config.get("delivery.report.only.error"))
        self.transactional = "transactional.id" in self.config
        self.txn_open = False
        self.txn_inits = 0
        self.state_refusals = 0
        """Transaction calls (and produce()) refused for the producer's state."""
        self.txn_sent: list[Sent] = []  # produced inside the open transaction
        self.committed_txns: list[tuple[list[Sent], list[tuple[int, int]]]] = []
        self.aborted: list[Sent] = []
        self.txn_offsets: list[tuple[int, int]] = []
        self.commit_txn_raises: KafkaException | None = None
        self.commit_timeouts = 0
        """commit_transaction calls that time out (retriable) while the commit goes on in
        the background, as librdkafka's do: an abort then is refused (`_CONFLICT`), and
        `purge` (the producer given up) leaves the commit to complete."""
        self._commit_in_flight = False
        self.abort_timeouts = 0
        """abort_transaction calls that time out (retriable: "retry call to resume") while
        the abort goes on, as librdkafka's do: the queue is purged at once, and until a
        call returns, any other transaction call is refused (`_CONFLICT`)."""
        self._abort_in_flight = False
        self.send_offsets_raises: KafkaException | None = None
        self.flush_leaves: int = 0  # reports a flush leaves unserved (a flush timeout)
        self.topics = dict(topics if topics is not None else {TARGET: 3, OTHER_TARGET: 3, DLQ: 1})
        self.clock = clock
        self.sent: list[Sent] = []
        self.attempts: list[Sent] = []
        self.reports: list[Sent] = []  # reports served, in order
        self.outcome: Callable[[Sent], KafkaError | None] = lambda _sent: None
        self.on_produce: Callable[[Sent], None] | None = None
        # True for a success librdkafka only inferred (no offset), as its idempotent
        # producer reports one after a later batch on the partition succeeded.
        self.inferred: Callable[[Sent], bool] = lambda _sent: False
        self.hold_reports = False
        self.metadata_error: KafkaException | None = None
        self.owner: FakeConsumer | None = None
        """The level's consumer: a committed transaction's offsets reach its group, and
        every commit is checked against what it owns (`violations`)."""
        self.violations: list[str] = []
        self.source_of: Callable[[Sent], tuple[TP, int] | None] = _source_of
        """The level record a send came from, for the ownership check (a test that
        knows more, such as which record a move copied, gives its own)."""
        self.abortable: KafkaError | None = None
        """Set by a failed delivery inside a transaction: produce() is refused until the
        abort, and commit_transaction raises it."""
        self.fatal_error: KafkaError | None = None
        self._fatal_raised = False
        self.fatal_after: int | None = None
        """Go fatal (`go_fatal`) once this many more records are queued."""
        self._pending: deque[Sent] = deque()
        self._cond = threading.Condition()

    def now(self) -> float:
        return self.clock.time() if self.clock is not None else time.time()

    # -- ProducerClient ----------------------------------------------------------------
    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        callback: Callable[[Any, Any], None] | None = None,
        on_delivery: Callable[[Any, Any], None] | None = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        """confluent-kafka's argument order, positional or by keyword."""
        on_delivery = on_delivery or callback
        assert timestamp == 0, "the forwarder never sets a timestamp"
        if not isinstance(topic, str):
            raise TypeError("topic must be a string")
        checked = _check_headers(headers)
        sent = Sent(
            topic, key, value, checked, None if partition == -1 else partition, on_delivery,
            self.now(),
        )  # fmt: skip
        with self._cond:
            self.attempts.append(sent)
        if self.fatal_error is not None:
            raise KafkaException(KafkaError(KafkaError._FATAL, "Local: Fatal error"))
        if self.transactional and self.abortable is not None:
            raise KafkaException(
                KafkaError(
                    KafkaError._STATE,
                    "Producing not allowed in transactional state ABORTABLE_ERROR",
                )
            )
        if self.transactional and not self.txn_open:  # rd_kafka_txn_may_enq_msg
            self.state_refusals += 1
            raise KafkaException(
                KafkaError(
                    KafkaError._STATE,
                    f"Producing not allowed in transactional state {self._txn_state()}",
                )
            )
        if self.on_produce is not None:
            self.on_produce(sent)
        with self._cond:
            if self.transactional:
                self.txn_sent.append(sent)
            self.sent.append(sent)
            self._pending.append(sent)
            self._cond.notify_all()
        if self.fatal_after is not None:
            self.fatal_after -= 1
            if self.fatal_after <= 0:
                self.fatal_after = None
                self.go_fatal()

    def has_txn_content(self) -> bool:
        """Whether the open transaction holds records or offsets (the coordinator has
        added a partition to it, and its timeout runs)."""
        return bool(self.txn_sent or self.txn_offsets)

    def go_fatal(self, code: int = KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER) -> None:
        """librdkafka raising a fatal error (an idempotence or transaction failure)."""
        with self._cond:
            self.fatal_error = KafkaError(code, f"fake fatal {code}", fatal=True)
            purged = list(self._pending)
        for sent in purged:
            sent.purged = True

    def _refuse_if_fatal(self) -> None:
        """The transaction API, once the producer is fatal."""
        if self.fatal_error is not None:
            raise KafkaException(self.fatal_error)

    def _raise_fatal_once(self) -> None:
        """poll()/flush() serving the fatal error event: raised once."""
        if self.fatal_error is not None and not self._fatal_raised:
            self._fatal_raised = True
            raise KafkaException(self.fatal_error)

    # -- transactions --------------------------------------------------------------------
    def init_transactions(self, timeout: float = -1) -> None:
        self._refuse_if_fatal()
        self.txn_inits += 1

    def _refuse_during_abort(self, call: str) -> None:
        if self._abort_in_flight:
            raise KafkaException(  # as rd_kafka_txn_curr_api_begin: retriable
                KafkaError(
                    KafkaError._CONFLICT,
                    f"{call}: Conflicting abort_transaction API call is already in progress",
                    retriable=True,
                )
            )

    def _txn_state(self) -> str:
        if not self.txn_inits:
            return "Init"
        if self.abortable is not None:
            return "AbortableError"
        return "InTransaction" if self.txn_open else "Ready"

    def _require_state(self, *, opened: bool) -> None:
        """A transaction call in a state that does not allow it fails as
        `rd_kafka_txn_require_state` fails it: `_STATE`, no flag (our code has no
        business there, but a call that lost its error leaves it unsure of the state)."""
        if self.txn_inits and self.txn_open == opened:
            return
        self.state_refusals += 1
        raise KafkaException(
            KafkaError(KafkaError._STATE, f"Operation not valid in state {self._txn_state()}")
        )

    def begin_transaction(self) -> None:
        self._refuse_if_fatal()
        self._refuse_during_abort("begin_transaction")
        self._require_state(opened=False)
        self.txn_open = True

    def send_offsets_to_transaction(
        self, offsets: list[TopicPartition], metadata: Any, timeout: float = -1
    ) -> None:
        self._refuse_if_fatal()
        self._require_state(opened=True)
        assert metadata is not None
        if self.abortable is not None:
            raise KafkaException(self._abortable_error())
        if self.send_offsets_raises is not None:
            raise self.send_offsets_raises
        owner = self.owner
        if owner is not None and metadata[2:] and metadata[2] != owner.current_generation():
            # rd_kafka_txn_handle_TxnOffsetCommit: ILLEGAL_GENERATION is permanent, and
            # the transaction abortable.
            self.abortable = KafkaError(
                KafkaError.ILLEGAL_GENERATION, "The generation of the group is not current"
            )
            raise KafkaException(self._abortable_error())
        self.txn_offsets = [((tp.topic, tp.partition), tp.offset) for tp in offsets]

    def _abortable_error(self) -> KafkaError:
        assert self.abortable is not None
        return KafkaError(
            self.abortable.code(),
            f"transaction must be aborted: {self.abortable.str()}",
            txn_requires_abort=True,
        )

    def commit_transaction(self, timeout: float = -1) -> None:
        self._refuse_if_fatal()
        self._refuse_during_abort("commit_transaction")
        self._require_state(opened=True)
        self.flush()
        if self.abortable is not None:
            raise KafkaException(self._abortable_error())
        if self.commit_timeouts > 0:
            self.commit_timeouts -= 1
            self._commit_in_flight = True
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, "commit timed out", retriable=True)
            )
        if self.commit_txn_raises is not None:
            raise self.commit_txn_raises
        self._check_ownership()
        self.committed_txns.append((self.txn_sent, self.txn_offsets))
        if self.owner is not None:
            with self.owner._cond:
                self.owner.committed_tps.update(dict(self.txn_offsets))
        self.txn_sent, self.txn_offsets, self.txn_open = [], [], False
        self._commit_in_flight = False

    def purge(self) -> None:
        """Given up: a commit already under way still completes (the coordinator has it)."""
        if self._commit_in_flight and self.txn_open:
            self.commit_timeouts, self.commit_txn_raises = 0, None
            self.commit_transaction()

    def _check_ownership(self) -> None:
        """The rule of exactly-once across rebalances: a transaction holds records and
        offsets of a partition only if they were read during its current assignment."""
        owner = self.owner
        if owner is None:
            return
        for tp, offset in self.txn_offsets:
            if tp not in owner.assigned_tps:
                self.violations.append(f"offset {offset} of unowned partition {tp}")
        for sent in self.txn_sent:
            source = self.source_of(sent)
            if source is None:
                continue
            tp, offset = source
            current = owner.generation.get(tp)
            if current is None:
                self.violations.append(f"record {tp}@{offset} of an unowned partition")
            elif owner.read_in.get(source) != current:
                self.violations.append(f"record {tp}@{offset} read under an earlier assignment")

    def abort_transaction(self, timeout: float = -1) -> None:
        self._refuse_if_fatal()
        self._require_state(opened=True)
        if self._commit_in_flight:
            raise KafkaException(
                KafkaError(KafkaError._CONFLICT, "a commit is in progress: cannot abort")
            )
        with self._cond:
            purged = list(self._pending)
        for sent in purged:  # librdkafka purges them at once (`rd_kafka_purge`)
            sent.purged = True
        if self.abort_timeouts > 0:
            self.abort_timeouts -= 1
            self._abort_in_flight = True
            raise KafkaException(
                KafkaError(
                    KafkaError._TIMED_OUT,
                    "Timed out waiting for operation to finish, retry call to resume",
                    retriable=True,
                )
            )
        self._abort_in_flight = False
        self._serve(None)  # and waits for them: their `_PURGE_QUEUE` reports come here
        self.aborted.extend(self.txn_sent)
        self.txn_sent, self.txn_offsets, self.txn_open = [], [], False
        self.abortable = None

    def visible(self, topic: str | None = None) -> list[Sent]:
        """What a read_committed reader of `topic` sees, in order."""
        if self.transactional:
            out = [s for sent, _ in self.committed_txns for s in sent if not s.lost]
        else:
            out = [s for s in self.reports if s.result is None and not s.lost]
        return [s for s in out if topic is None or s.topic == topic]

    def poll(self, timeout: float = 0) -> int:
        served = 0 if self.hold_reports else self._serve(None)
        self._raise_fatal_once()
        if not served and timeout and timeout > 0:
            if self.clock is not None:
                self.clock.advance(timeout)  # the time a real poll would have waited
            else:
                with self._cond:
                    self._cond.wait(timeout)
        return served

    def flush(self, timeout: float = -1) -> int:
        if not self.hold_reports:
            with self._cond:
                keep = min(self.flush_leaves, len(self._pending))
            self._serve(None if not keep else self.pending - keep)
        self._raise_fatal_once()
        with self._cond:
            return len(self._pending)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        if self.metadata_error is not None:
            raise self.metadata_error
        names = [topic] if topic is not None else list(self.topics)
        topics = {
            name: SimpleNamespace(
                partitions={i: SimpleNamespace(id=i) for i in range(self.topics[name])},
                error=None,
            )
            for name in names
            if name in self.topics
        }
        return SimpleNamespace(topics=topics)

    # -- test controls ---------------------------------------------------------------
    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def deliver(self, count: int | None = None) -> int:
        """Serve up to `count` held reports (all by default), whatever `hold_reports` says."""
        return self._serve(count)

    def to(self, topic: str) -> list[Sent]:
        with self._cond:
            return [s for s in self.sent if s.topic == topic]

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def partition_of(self, sent: Sent) -> int:
        """The partition a report names: the explicit one, else a hash of the key."""
        if sent.partition is not None:
            return sent.partition
        return zlib.crc32(sent.key or b"") % max(1, self.topics.get(sent.topic, 1))

    def _serve(self, count: int | None) -> int:
        served = 0
        while count is None or served < count:
            with self._cond:
                if not self._pending:
                    break
                sent = self._pending.popleft()
            sent.result = (
                KafkaError(KafkaError._PURGE_QUEUE, "Local: Purged in queue")
                if sent.purged
                else self.outcome(sent)
            )
            assert sent.result is None or not sent.result.fatal(), (
                "librdkafka never reports a delivery as fatal: use go_fatal()"
            )
            if sent.result is not None and self.transactional and self.txn_open:
                self.abortable = self.abortable or sent.result
            sent.lost = sent.result is None and self.inferred(sent)
            ts_ms = int(self.now() * 1000)
            report = Message(
                topic=sent.topic,
                partition=self.partition_of(sent),
                offset=(
                    -1001  # OFFSET_INVALID, as librdkafka leaves an inferred ack
                    if sent.result is not None or sent.lost
                    else len(self.reports)
                ),
                key=sent.key,
                value=sent.value,
                headers=sent.headers,
                timestamp=(TIMESTAMP_CREATE_TIME, ts_ms),
                error=sent.result,
            )
            if sent.lost:
                self._log_inferred(sent)
            with self._cond:
                self.reports.append(sent)
            callback = sent.on_delivery or self.dr_cb
            if callback is not None and not (self.only_error and sent.result is None):
                callback(sent.result, report)
            served += 1
        return served

    def _log_inferred(self, sent: Sent) -> None:
        """librdkafka's debug line for an inferred success, in its `eos` context only."""
        logger = self.config.get("logger")
        contexts = str(self.config.get("debug") or "").split(",")
        if logger is not None and ("eos" in contexts or "msg" in contexts):
            logger.log(
                logging.DEBUG,
                "%s [%s] %s",
                "IMPLICITACK",
                "rdkafka#producer-1",
                f"{sent.topic} [{self.partition_of(sent)}] 1 message(s) implicitly acked by "
                "subsequent batch success",
            )


def first_topic(offsets: Iterable[tuple[TP, int]]) -> list[tuple[int, int]]:
    """(partition, offset) pairs of `LEVEL_TOPIC` among a transaction's offsets."""
    return [(tp[1], offset) for tp, offset in offsets if tp[0] == LEVEL_TOPIC]


def inferred_once(which: Callable[[Sent], bool]) -> Callable[[Sent], bool]:
    """A `FakeProducer.inferred` for the first record `which` picks, once."""
    left = [1]

    def inferred(sent: Sent) -> bool:
        if left[0] and which(sent):
            left[0] -= 1
            return True
        return False

    return inferred


def kafka_error(code: int, *, retriable: bool = False, fatal: bool = False) -> KafkaError:
    return KafkaError(code, f"fake {code}", fatal=fatal, retriable=retriable)


# -- the rig ------------------------------------------------------------------------
@dataclass
class _Fakes:
    """What every rig has: the fake clients, the metrics and the clock."""

    registry: CollectorRegistry
    metrics: ServiceMetrics
    clock: FakeClock | None
    consumer: FakeConsumer
    producer: FakeProducer

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the rig's level (a per-level family) or of its worker."""
        for default in ({"level": LEVEL.name}, {"worker": WORKER}):
            value = self.registry.get_sample_value(name, {**default, **labels})
            if value is not None:
                return value
        return 0.0

    def now_ms(self) -> int:
        return self.clock.ms() if self.clock is not None else int(time.time() * 1000)


# -- the level worker's rig -----------------------------------------------------------
@dataclass
class LevelRig(_Fakes):
    """A level worker (consumer loop, partition group, forwarder) on fakes."""

    group: PartitionGroup
    budget: MemoryBudget
    flow: FlowControl
    forwarder: Forwarder
    loop: ConsumerLoop
    fatal: list[str]
    markers: WorkerMarkers | None = None
    """With `markers=True`: the worker's side of cancel and reschedule, over a book and
    a gate the test fills and moves itself (no reader thread)."""


LEVELS = LevelSet([PREVIOUS_DELAY_MS, LEVEL.delay_ms, 20_000, MAX_DELAY_MS], "delay_topic_")
LONGER = LEVELS.levels[2]
"""A second level a worker may serve beside `LEVEL` (20 s, delay_topic_3)."""
WORKER = "levels"
"""The rig's worker name (the per-worker metrics' label)."""


PRODUCERS: list[FakeProducer] = []
"""Every level rig's producer, for the check that no test committed what it did not own
(`tests/level/conftest.py`)."""


def make_level_rig(
    *,
    clock: FakeClock | None = None,
    exactly_once: bool = False,
    high_water: int = 1_000,
    low_water: int = 10,
    max_bytes: int = 2**40,
    backoff: tuple[float, float] = (1.0, 8.0),
    give_up_s: float = 60.0,
    commit_interval_s: float = 1.0,
    topics: dict[str, int] | None = None,
    precise_topic: str | None = None,
    hold_back: bool = False,
    levels: tuple[Level, ...] = (LEVEL,),
    markers: bool = False,
    cancel_lead_ms: int = 0,
) -> LevelRig:
    """The level worker of `LevelWorker` on fakes. With a clock, everything runs on it.
    `hold_back`: due times are met by a `BrokerClock` over it, as in the daemon (left out
    by default: records the tests append as already due would wait for the bound).
    `levels`: what the worker serves (one level by default, `LEVEL`; the consumer's
    first topic is the first level's)."""
    registry = CollectorRegistry()
    metrics = ServiceMetrics(registry)
    consumer = FakeConsumer(*(level.topic for level in levels))
    box: list[Forwarder] = []
    config: dict[str, Any] = {
        "delivery.report.only.error": True,
        "on_delivery": lambda error, msg: box[0].on_report(error, msg),  # noqa: PLW0108  # bound later
    }
    if exactly_once:
        config["transactional.id"] = "delayservice-test-delay_topic_2"
    unconfirmed = watch_unconfirmed(config)
    all_topics = dict(topics if topics is not None else {TARGET: 3, OTHER_TARGET: 3, DLQ: 1})
    for level in LEVELS:
        all_topics.setdefault(level.topic, 3)
    if precise_topic is not None:
        all_topics.setdefault(precise_topic, 3)
    all_topics.setdefault(OUTCOMES, 1)
    producer = FakeProducer(all_topics, clock, config)
    producer.owner = consumer
    PRODUCERS.append(producer)
    base: Any = clock if clock is not None else time
    broker_clock = BrokerClock(base, MAX_HOLD_BACK_S if hold_back else 0.0)
    due_clock: Any = broker_clock if hold_back else base
    view = None
    if markers:
        view = WorkerMarkers(
            WORKER,
            MarkerBook(LEVELS),
            MarkerGate(LEAD_MS),
            LEVELS,
            OUTCOMES,
            metrics,
            lambda: int(due_clock.time() * 1000),
            transactional=exactly_once,
            cancel_lead_ms=cancel_lead_ms,
        )
    group = PartitionGroup(
        [(lv.topic, lv.delay_ms, LEVELS.previous_delay_ms(lv)) for lv in levels],
        due_clock.time,
        lambda topic, n: metrics.level_mismatches.labels(
            LEVELS.by_topic(topic).name,  # type: ignore[union-attr]
            "not_append_time",
        ).inc(n),
        view,
    )
    budget = MemoryBudget(max_bytes)
    budget.register(group)
    flow = FlowControl(high_water, low_water, budget)
    fatal: list[str] = []
    routes = level_routes(
        LEVELS,
        precise_topic,
        DLQ,
        frozenset({*(lv.topic for lv in LEVELS), DLQ}),
        view,
    )
    forwarder = Forwarder(
        levels,
        group,
        producer,
        TargetTopics(producer, clock=base),
        routes,
        metrics,
        fatal.append,
        name=WORKER,
        transactional=exactly_once,
        unconfirmed=unconfirmed,
        commit_interval_s=commit_interval_s,
        flush_timeout_s=1.0,
        backoff=backoff,
        give_up_s=give_up_s,
        clock=due_clock,
    )
    box.append(forwarder)
    forwarder.interval.listener = view
    loop = ConsumerLoop(
        levels, consumer.make, group, flow, forwarder, metrics, on_fatal=fatal.append,
        stop_timeout_s=2.0, broker_clock=broker_clock, name=WORKER,
    )  # fmt: skip
    return LevelRig(
        registry, metrics, clock, consumer, producer, group, budget, flow, forwarder, loop,
        fatal, view,
    )  # fmt: skip


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Poll a condition (never a fixed sleep standing in for one)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)
