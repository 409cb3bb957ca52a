"""The thread that reads the level markers topic and its outcomes topic, one per process.

It owns one consumer, assigned every partition of both topics (no group: nothing here
is committed, so a kill -9 loses nothing). At start it reads from twice the top
level's delay ago, and again from earlier whenever a partition group holds older
records (`MarkerGate.need`). Each partition is read to a target of its own: the
reader notes the time, asks the broker where the partition ends, and reads up to
there; markers go to the book, answers mark what was answered and carried out, that
partition's gate moves to the time noted, and the forwarders with markers to serve are
woken (`on_pass`). A partition that reached its target gets a new one every
`IDLE_PASS_S`, so a flood on one markers partition holds back only the records whose
markers go there (`MarkerGate.through_for`). Each pass also lists both topics' partitions
again, after noting the time: a partition added while the reader runs (the SDK spreads
markers over the topic's current partitions) is assigned from its beginning and read
to its end before the gate moves past the time noted. It passes when a group
waits for the gate, when a rewind is asked for, and otherwise every `IDLE_PASS_S`, so
markers are answered promptly even while nothing is due.

A marker it cannot read (no id, an id that is not UTF-8, a new time that is not a
number) is filed as refused, with the reason, and answered by the owner of the first
level's partition 0; nothing a marker carries stops the thread.

A topic deleted and made again while the reader runs (`topics create` run again after a
mistake) starts its offsets over, below where the old one was read: read on from
there, the reader would skip the new topic's markers, and the gate would pass them as
read. So each pass, once it has both topics' ends, asks for the topics' ids: a changed
id logs a WARNING naming the topic, keeps the old topic's markers for the records they
may concern (answered no more: their answer keys now name the new topic's), and reads
the new topic from its start before the gate moves again; readiness says so meanwhile.

The book has a share of the memory budget (`MarkerBook.max_bytes`). When it reaches it
and letting go of what decides nothing (`MarkerBook.shed`) does not make room, the
reader pauses the markers partitions and goes on reading only the answers (which let
the book shed more): the gate stays where it was, so level records due since wait,
late but never with a cancel forgotten. Readiness and
`delayservice_level_markers_book_full` say so meanwhile, and a WARNING says so once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import (
    Consumer,
    KafkaException,
    Message,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from delayservice.envelope import H_CANCEL, H_RESCHEDULE
from delayservice.forward.buffer import TP
from delayservice.kafka import client_config
from delayservice.kafka.client_errors import STARTING_CODES, error_of, raised_by
from delayservice.kafka.log_levels import GraceStreaks
from delayservice.kafka.record_headers import UNREADABLE, read_headers
from delayservice.level.marker_book import REFUSED, MarkerBook
from delayservice.level.marker_gate import MarkerGate
from delayservice.level.marker_verdict import LevelMarker
from delayservice.log_throttle import Throttle
from delayservice.markers.level_ids import level_place, tail_partition
from delayservice.markers.replies import CANCEL, RESCHEDULE, parse_reply
from delayservice.markers.requests import BadMarkerError, reschedule_request
from delayservice.metrics.heartbeat import STUCK_S, Heartbeat
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.settings import Settings

log = logging.getLogger(__name__)

IDLE_PASS_S: Final = 0.1
PASS_TIMEOUT_S: Final = 5.0
POLL_S: Final = 0.05
BATCH: Final = 1000
ERROR_PAUSE_S: Final = 0.5
QUEUED_AHEAD: Final = 2000
"""Records fetched ahead per partition (librdkafka's `queued.min.messages`, 100,000 by
default): a marker on a quiet partition waits behind at most about this many of a
flooded one's, and one fetch more."""
FETCH_BYTES: Final = 256 * 1024
"""The most one fetch takes from one partition (`max.partition.fetch.bytes`)."""
FETCH_BACKOFF_MS: Final = 5
"""How soon a partition whose queue was full is fetched again (`fetch.queue.backoff.ms`,
1,000 by default: with a short queue, a flood would be read a queue a second)."""
METADATA_S: Final = 60.0
"""How often the level topics' partition counts are read again; a marker naming a
partition beyond them has them read again before it is refused (`_file`)."""

FLOOD_NUDGE_S: Final = 1.0
"""While a partition is still being read to its target (a flood), how often the
forwarders are told of what the others' reads filed: each tells them to serve the
markers, and serving a flood's after each batch would slow its reading tenfold."""

MakeConsumer = Callable[[dict[str, Any]], Any]
TopicIds = Callable[[list[str]], dict[str, str]]
"""Topic names -> their topic ids (which change when a topic is made again)."""


class _RemadeError(Exception):
    """A topic the reader reads was deleted and made again: read it again from its start."""


class _CountsUnreadError(Exception):
    """The level topics' partition counts could not be read again for a marker naming a
    partition past them: the marker is read again by a fresh consumer, never skipped."""


def admin_topic_ids(settings: Settings) -> TopicIds:
    """The topic ids, as the broker's admin API gives them (one round trip)."""
    admin: AdminClient | None = None

    def topic_ids(names: list[str]) -> dict[str, str]:
        nonlocal admin
        if admin is None:
            admin = AdminClient(client_config.admin(settings))
        futures = admin.describe_topics(TopicCollection(names), request_timeout=PASS_TIMEOUT_S)
        return {name: str(future.result().topic_id) for name, future in futures.items()}

    return topic_ids


@dataclass(frozen=True, slots=True)
class _Target:
    """Where one partition is read to before its gate moves to `began_ms`: every record
    appended to it before then is below `end`."""

    began_ms: int
    end: int
    generation: int


def marker_of(message: Message) -> tuple[LevelMarker, tuple[str, str] | None] | None:
    """A record of the markers topic as a marker, with its refusal (outcome, reason) if
    it asks nothing a daemon can do; None for a record that is no marker at all."""
    _, appended = message.timestamp()
    where = (message.topic() or "", message.partition() or 0, message.offset() or 0)
    headers = read_headers(message)
    if headers is UNREADABLE or not isinstance(headers, list):
        return LevelMarker(CANCEL, "", appended, *where), (REFUSED, "its headers cannot be read")
    for name, kind in ((H_CANCEL, CANCEL), (H_RESCHEDULE, RESCHEDULE)):
        values = [value for header, value in headers if header == name]
        if not values:
            continue
        raw = values[0]
        try:
            message_id = raw.decode() if isinstance(raw, bytes) else (raw or "")
        except UnicodeDecodeError:
            return LevelMarker(kind, "", appended, *where), (REFUSED, "its id is not UTF-8")
        if not message_id:
            return LevelMarker(kind, "", appended, *where), (REFUSED, f"a {kind} without an id")
        if kind == CANCEL:
            return LevelMarker(CANCEL, message_id, appended, *where), None
        try:
            request = reschedule_request(headers)
        except BadMarkerError as exc:
            return LevelMarker(kind, message_id, appended, *where), (REFUSED, str(exc))
        _, delay_ms, due_ms = request or ("", None, None)
        asked = max(appended + (delay_ms or 0), due_ms or 0)
        return LevelMarker(kind, message_id, appended, *where, asked), None
    return None


def _partitions(consumer: Any, topic: str) -> list[int]:
    meta = consumer.list_topics(topic, timeout=PASS_TIMEOUT_S).topics.get(topic)
    if meta is not None and meta.error is not None:  # a pass waits and asks again
        raise KafkaException(meta.error)
    if meta is None or not meta.partitions:
        why = meta.error if meta is not None and meta.error is not None else "no partitions"
        raise RuntimeError(f"{topic}: {why}")
    return sorted(meta.partitions)


class MarkerReader:
    name: Final = "markers"

    def __init__(
        self,
        settings: Settings,
        book: MarkerBook,
        gate: MarkerGate,
        metrics: ServiceMetrics,
        now_ms: Callable[[], int],
        make_consumer: MakeConsumer = Consumer,
        on_pass: Callable[[], None] = lambda: None,
        topic_ids: TopicIds | None = None,
    ) -> None:
        """`on_pass`: runs after each pass that reached the end of the markers topic.
        `topic_ids`: how the topics' ids are asked for (None: through the admin API
        when the consumers are real, not at all when they are made by the caller)."""
        self._on_pass = on_pass
        self._settings = settings
        self._book = book
        self._gate = gate
        self._now_ms = now_ms
        self._make_consumer = make_consumer
        levels = settings.level_set()
        self._window_ms = 2 * levels.max_delay_ms + gate.lead_ms
        self._level_topics = [level.topic for level in levels]
        self._markers_topic = settings.markers_topic
        self._outcomes_topic = settings.markers_outcomes_topic
        self._metrics = metrics
        self._m_errors = metrics.loop_errors.labels(self.name, "reader")
        self._stopping = threading.Event()
        self._throttle = Throttle()
        self._starting = GraceStreaks()
        self._assigned: list[TopicPartition] = []
        self._read_to: dict[TP, int] = {}
        self._counts: dict[str, int] = {}
        """Per topic read, the most partitions it was seen with (a growth is told once)."""
        self._next_metadata = 0.0
        self._batches = 0  # batches of records read so far
        self._counts_after = -1
        """How many batches had been read when the level topics' partition counts were
        last read: a marker of a later batch may name a partition added since."""
        self._next_pass = 0
        """When (epoch ms) the next pass is due while no group waits."""
        self._read_once = False
        self._targets: dict[TP, _Target] = {}
        """Per partition, what it must be read to before its gate moves to the target's
        time. Kept across passes that run out of time, so a backlog growing faster than
        one pass reads still ends: the next pass goes on to the same end, not to a
        further one. A partition that reaches its target gets a new one at the next
        round (`IDLE_PASS_S`; `_next_round`, monotonic), while a flooded one goes on to
        its own."""
        # When (monotonic) the forwarders were last told of a read: `_nudged_at`.
        self._next_round = self._nudged_at = 0.0
        self.heartbeat = Heartbeat()
        """Beats once per turn of the loop."""
        self._advanced_at = time.monotonic()
        """When a pass last moved the gate (readiness: `health`)."""
        self._full_since: float | None = None
        """When the book reached its share and markers stopped being read (None: not)."""
        self._markers_paused = False
        if topic_ids is None and make_consumer is Consumer:
            topic_ids = admin_topic_ids(settings)
        self._topic_ids = topic_ids
        self._ids: dict[str, str] = {}
        """The id of each topic read, as last seen."""
        self._from_start: set[str] = set()
        """Topics made again: the next consumer reads them from their start."""
        self._remade: str | None = None
        """Readiness: the topic made again, until a pass has read the new one through."""
        self._lister: Any = None
        """A second consumer, never assigned, that lists the topics' partitions: asked
        on the reading one, each answer waits behind a fetch (`fetch.wait.max.ms`, a
        wait on every record's path); here it takes a round trip."""
        self._thread = threading.Thread(target=self._main, name="marker-reader", daemon=True)

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def request_stop(self) -> None:
        self._stopping.set()
        self._gate.demand.set()

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def health(self, limit_s: float = STUCK_S) -> tuple[bool, str]:
        """Ready once the markers were read through once and while the gate moves: a
        rewind (a partition with older records) holds forwarding for a moment, not
        readiness, but a gate that has not moved for `limit_s` holds every level
        record due since (a flood of markers, a topic that cannot be read, a stuck
        read) and says so."""
        if not self._thread.is_alive():
            return False, "markers: reader stopped"
        if not self._read_once:
            return False, "markers: not read yet"
        if self._remade is not None:
            return False, (
                f"markers: {self._remade} was deleted and made again; reading the new one"
                " from its start, level records due since wait"
            )
        if self._full_since is not None:
            book = self._book
            return False, (
                f"markers: the book of markers is at its share of the memory budget "
                f"({book.total_bytes // 2**20} of {(book.max_bytes or 0) // 2**20} MiB) for "
                f"{time.monotonic() - self._full_since:.0f}s; no more markers are read, so "
                "level records due since wait"
            )
        still = time.monotonic() - self._advanced_at
        if still > limit_s:
            step = self.heartbeat.still_s()
            why = f"; one turn has lasted {step:.0f}s" if step > limit_s else ""
            return False, (
                f"markers: not read through for {still:.0f}s, so level records due since wait{why}"
            )
        return True, "markers: read"

    # -- the loop --------------------------------------------------------------------
    def _main(self) -> None:
        consumer: Any = None
        while not self._stopping.is_set():
            consumer = self._turn(consumer)
        if consumer is not None:
            consumer.close()
        if self._lister is not None:
            self._lister.close()

    def _turn(self, consumer: Any) -> Any:
        """One turn of the loop on `consumer` (None: open one first); returns the
        consumer to go on with, None when the next turn must open a fresh one. Nothing
        a client raises ends the thread: a bare `KafkaError` (`client_errors`) is
        handled as the `KafkaException` it should have been."""
        self.heartbeat.beat()
        held = [consumer]
        exc = raised_by(lambda: self._turn_on(held))
        consumer = held[0]
        if exc is None:
            return consumer
        if isinstance(exc, _RemadeError):
            with contextlib.suppress(Exception):  # a broken client may refuse even this
                consumer.close()
            return None
        self._failed(consumer, exc)
        return None

    def _turn_on(self, held: list[Any]) -> None:
        if held[0] is None:
            held[0] = self._open()
        if self._gate.rewind_asked():
            # A fresh consumer from the earlier point: one sought back could still give
            # the position it had before the seek, and the gate would open on markers
            # not read again yet.
            consumer, held[0] = held[0], None
            consumer.close()  # raising, it leaves no consumer to go on with
            return
        self._step(held[0])

    def _failed(self, consumer: Any, exc: Exception) -> None:
        """Say why, close `consumer` and pause: the next turn opens a fresh one."""
        self._m_errors.inc()
        error = error_of(exc)
        young = (
            error is not None
            and error.code() in STARTING_CODES
            and self._starting.young(error.code())
        )
        if self._throttle.allow(type(exc).__name__) is not None:
            if young and error is not None:  # a topic just made, a broker starting
                log.info("markers: %s; reading again", error.str())
            else:
                log.warning("markers: %r; reading again", exc, exc_info=exc)
        if consumer is not None:
            with contextlib.suppress(Exception):  # a broken client may refuse even this
                consumer.close()
        self._stopping.wait(ERROR_PAUSE_S)

    def _config(self, role: str) -> dict[str, Any]:
        return {
            **client_config.common(self._settings),
            "group.id": f"delayservice-markers-{uuid.uuid4().hex}",
            "client.id": f"delayservice-{role}-{self._settings.instance_name}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 10,
            # One queue serves every partition: keep what is fetched ahead of a flooded
            # one small, so another partition's new marker is not queued behind it.
            "queued.min.messages": QUEUED_AHEAD,
            "max.partition.fetch.bytes": FETCH_BYTES,
            "fetch.queue.backoff.ms": FETCH_BACKOFF_MS,
            **self._settings.consumer,
        }

    def _open(self) -> Any:
        """A fresh consumer, assigned both topics from where the book needs them."""
        consumer = self._make_consumer(self._config("markers"))
        try:
            self._check_ids()  # a topic made again while closed is read from its start
            self._assigned = [
                TopicPartition(topic, p)
                for topic in (self._markers_topic, self._outcomes_topic)
                for p in self._listed(consumer, topic)
            ]
            self._tell_gate(self._assigned)
            self._read_metadata(consumer)
            start = self._now_ms() - self._window_ms
            rewind = self._gate.take_rewind()
            # Records handed over before the first read need markers from as far back.
            wanted = [
                self._gate.covered_from_ms,
                self._gate.earliest_need(),
                None if rewind is None else rewind[0],
            ]
            since = min([start, *(ms for ms in wanted if ms is not None)])
            self._gate.start(since)
            consumer.assign(self._starts(consumer, since))
        except:  # a bare KafkaError too (kafka.client_errors)
            consumer.close()
            raise
        log.info(
            "markers: reading %s and %s from %d%s",
            self._markers_topic,
            self._outcomes_topic,
            since,
            " again, for a partition holding older records" if rewind is not None else "",
        )
        self._next_pass = 0  # at once
        self._targets = {}  # positions start over: so do the targets
        self._markers_paused = False
        return consumer

    def _listed(self, consumer: Any, topic: str) -> list[int]:
        return self._told(topic, _partitions(consumer, topic))

    def _told(self, topic: str, listed: list[int]) -> list[int]:
        """`listed`, `topic`'s partitions now, with a WARNING the first time the topic
        is seen grown."""
        known = self._counts.get(topic)
        if known is not None and len(listed) > known:
            log.warning(
                "markers: %s grew from %d to %d partitions while the daemon ran; the new"
                " ones are read from their beginning before the gate moves on",
                topic,
                known,
                len(listed),
            )
        self._counts[topic] = max(len(listed), known or 0)
        if topic == self._markers_topic:
            self._gate.markers_count(len(listed), self._now_ms())
        return listed

    def _tell_gate(self, tps: list[TopicPartition]) -> None:
        """The gate shuts the records whose markers may be on a partition not read yet."""
        self._gate.read_parts(
            [tp.partition for tp in tps if tp.topic == self._markers_topic],
            [tp.partition for tp in tps if tp.topic == self._outcomes_topic],
        )

    def _follow_growth(self, consumer: Any, listed: dict[str, list[int]]) -> dict[TP, int]:
        """Assign the partitions added to either topic since it was listed, from their
        beginning, and return their ends: the pass reads them to there before the gate
        moves. `listed` was asked for after the pass noted its time, so a marker
        acknowledged before then is on a partition it names."""
        held = {(tp.topic, tp.partition) for tp in self._assigned}
        added = [
            TopicPartition(topic, p)
            for topic, partitions in listed.items()
            for p in self._told(topic, partitions)
            if (topic, p) not in held
        ]
        if not added:
            return {}
        for topic in {tp.topic for tp in added}:  # the reading consumer learns of them too
            _partitions(consumer, topic)
        marks = {
            (tp.topic, tp.partition): consumer.get_watermark_offsets(tp, PASS_TIMEOUT_S, False)
            for tp in added
        }
        consumer.incremental_assign([TopicPartition(*tp, low) for tp, (low, _) in marks.items()])
        for tp, (low, _) in marks.items():
            self._read_to[tp] = low
        self._assigned = [*self._assigned, *added]
        self._tell_gate(added)
        return {tp: high for tp, (_, high) in marks.items()}

    def _starts(self, consumer: Any, since_ms: int) -> list[TopicPartition]:
        asked = [TopicPartition(tp.topic, tp.partition, max(0, since_ms)) for tp in self._assigned]
        found = consumer.offsets_for_times(asked, timeout=PASS_TIMEOUT_S)
        out = []
        for tp in found:
            if tp.error is not None:
                raise KafkaException(tp.error)
            offset = tp.offset
            if tp.topic in self._from_start:  # made again: every record of it is new
                offset = consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=PASS_TIMEOUT_S, cached=False
                )[0]
            if offset < 0:  # nothing that recent: from the end
                offset = consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=PASS_TIMEOUT_S, cached=False
                )[1]
            out.append(TopicPartition(tp.topic, tp.partition, offset))
            self._read_to[(tp.topic, tp.partition)] = offset
        self._from_start.clear()
        return out

    def _read_metadata(self, consumer: Any) -> None:
        after = self._batches
        for topic in self._level_topics:
            meta = consumer.list_topics(topic, timeout=PASS_TIMEOUT_S).topics.get(topic)
            if meta is not None and meta.error is None and meta.partitions:
                self._book.partition_count(topic, len(meta.partitions))
        self._counts_after = after
        self._next_metadata = time.monotonic() + METADATA_S

    def _step(self, consumer: Any) -> None:
        now = self._now_ms()
        wanted = self._gate.next_wanted_ms()
        if self._full_since is not None and now < self._next_pass:
            wanted = None  # a full book waits for room, not for the records that want it
        if (wanted is None or wanted > now) and now < self._next_pass:
            until = min(self._next_pass, wanted if wanted is not None else self._next_pass)
            self._gate.demand.wait(max(0.0, (until - now) / 1000))
            self._gate.demand.clear()
            return
        try:
            if time.monotonic() >= self._next_metadata:
                self._read_metadata(consumer)
            self._pass(consumer)
        except KafkaException as exc:  # a broker away: the gate waits, and so does forwarding
            if self._throttle.allow("broker") is not None:
                log.warning("markers: %s; reading again", exc)
            self._stopping.wait(ERROR_PAUSE_S)

    def _pass(self, consumer: Any) -> None:
        """Give each partition without one a target (note the time, follow partitions
        added since, find where they end), read, and move each partition's gate as it
        reaches its target. A pass that runs out of time returns and the next goes on
        to the same targets; while one partition is flooded, the others get new targets
        every `IDLE_PASS_S` and their records go on."""
        generation = self._gate.generation
        if any(t.generation != generation for t in self._targets.values()):
            self._targets = {}
        self._top_up(consumer)
        deadline = time.monotonic() + PASS_TIMEOUT_S
        while self._markers_pending():
            if self._stopping.is_set():
                return
            if self._book_full(consumer):
                return  # the gate stays where it was: forwarding waits, never early
            self._read(consumer, consumer.consume(BATCH, POLL_S))  # a batch at least, every pass
            self._note_positions(consumer)
            self._settle()
            if not self._markers_pending():
                break
            if time.monotonic() > deadline:
                return  # the gate stays where it was: forwarding waits, never early
            if time.monotonic() >= self._next_round:
                self._top_up(consumer)
        # What else is queued (answers, mostly), for a moment only: a flood that began
        # after the targets were noted keeps the queue full, and drained to its end it
        # kept every partition's gate where it was until the flood was read.
        until = time.monotonic() + IDLE_PASS_S
        for message_batch in iter(lambda: consumer.consume(BATCH, 0), []):
            self._read(consumer, message_batch)
            if time.monotonic() >= until:
                break
        self._note_positions(consumer)
        self._settle()
        if self._remade is not None:
            log.info("markers: %s, made again, read through", self._remade)
            self._remade = None
        self._read_once = True
        self._advanced_at = time.monotonic()
        self._next_pass = self._now_ms() + int(IDLE_PASS_S * 1000)
        self._forget(self._now_ms())

    def _markers_pending(self) -> bool:
        topic = self._markers_topic
        return any(tp[0] == topic for tp in self._targets)

    def _settle(self) -> None:
        """Move the gate of each partition read to its target, and tell the forwarders."""
        read_to, markers_topic = self._read_to, self._markers_topic
        reached: dict[int, tuple[dict[int, int], dict[int, int]]] = {}
        for tp, target in list(self._targets.items()):
            if read_to.get(tp, -1) < target.end:
                continue
            del self._targets[tp]
            markers, outcomes = reached.setdefault(target.generation, ({}, {}))
            (markers if tp[0] == markers_topic else outcomes)[tp[1]] = target.began_ms
        for generation, (markers, outcomes) in reached.items():
            self._gate.advance_parts(markers, outcomes, generation)
        if not reached:
            return
        now = time.monotonic()
        if not self._markers_pending() or now >= self._nudged_at + FLOOD_NUDGE_S:
            self._nudged_at = now
            self._on_pass()

    def _book_full(self, consumer: Any) -> bool:
        """Whether the book is at its share: then the markers partitions are paused,
        the answers queued are read (they let the book shed), and the pass ends."""
        book = self._book
        full = book.at_share(resuming=self._full_since is not None)
        if full:
            self._forget(self._now_ms())  # what no waiting record needs, and what decides nothing
            book.shed()
            full = book.at_share(resuming=self._full_since is not None)
        markers = [tp for tp in self._assigned if tp.topic == self._markers_topic]
        if not full:
            if self._markers_paused:
                consumer.resume(markers)
                self._markers_paused = False
            if self._full_since is not None:
                log.info("markers: the book has room again; reading markers again")
                self._full_since = None
                self._metrics.level_markers_book_full.set(0)
            return False
        if not self._markers_paused:
            consumer.pause(markers)
            self._markers_paused = True
        if self._full_since is None:
            self._full_since = time.monotonic()
            self._metrics.level_markers_book_full.set(1)
            log.warning(
                "markers: the book of markers reached its share of the memory budget"
                " (%d of %d bytes, %d markers kept); reading %s paused until it has room,"
                " so level records due since wait (late, no cancel forgotten)",
                book.total_bytes,
                book.max_bytes or 0,
                sum(book.kept().values()),
                self._markers_topic,
            )
        # The answers, which let the book shed.
        self._read(consumer, consumer.consume(BATCH, POLL_S))
        for message_batch in iter(lambda: consumer.consume(BATCH, 0), []):
            self._read(consumer, message_batch)
        self._note_positions(consumer)
        self._next_pass = self._now_ms() + int(IDLE_PASS_S * 1000)
        return True

    def _top_up(self, consumer: Any) -> None:
        """Note the time, then where each partition without a target ends: every marker
        acknowledged before that time is below those ends. Partitions added since are
        followed first, from their beginning. The ends are asked of the idle lister:
        asked of the reading consumer, each waits behind its fetch."""
        generation = self._gate.generation
        began = self._now_ms()
        self._next_round = time.monotonic() + IDLE_PASS_S
        if self._lister is None:
            self._lister = self._make_consumer(self._config("markers-lister"))
        listed = {  # asked for after `began`
            topic: _partitions(self._lister, topic)
            for topic in (self._markers_topic, self._outcomes_topic)
        }
        ends = self._follow_growth(consumer, listed)
        targets = self._targets
        ends.update(
            {
                (tp.topic, tp.partition): self._lister.get_watermark_offsets(
                    tp, timeout=PASS_TIMEOUT_S, cached=False
                )[1]
                for tp in self._assigned
                if (tp.topic, tp.partition) not in ends and (tp.topic, tp.partition) not in targets
            }
        )
        if self._check_ids():  # asked after the ends: they are the topics read
            raise _RemadeError
        for tp, end in ends.items():
            targets[tp] = _Target(began, end, generation)

    def _check_ids(self) -> set[str]:
        """The topics made again since their ids were last seen: each told once, with a
        WARNING, and read again from its start by the next consumer."""
        if self._topic_ids is None:
            return set()
        topics = [self._markers_topic, self._outcomes_topic]
        seen = self._topic_ids(topics)
        remade = {t for t in topics if t in self._ids and seen.get(t) != self._ids[t]}
        for topic in sorted(remade):
            log.warning(
                "markers: %s was deleted and made again while the daemon ran (topic id %s,"
                " now %s); reading the new one from its start, level records wait until it"
                " is read",
                topic,
                self._ids[topic],
                seen.get(topic),
            )
            self._from_start.add(topic)
            self._counts.pop(topic, None)
            self._read_to = {tp: at for tp, at in self._read_to.items() if tp[0] != topic}
            if topic == self._markers_topic:
                self._book.retire(topic)
            self._remade = topic
        self._ids.update(seen)
        return remade

    def _note_positions(self, consumer: Any) -> None:
        """Where each partition's reading got to: the consumer's position steps over
        the transaction markers that end the outcomes topic."""
        for tp in consumer.position(self._assigned):
            key = (tp.topic, tp.partition)
            if tp.offset >= 0 and tp.offset > self._read_to.get(key, -1):
                self._read_to[key] = tp.offset

    def _read(self, consumer: Any, messages: list[Message]) -> None:
        self._batches += 1
        batch = self._batches  # every marker in it was appended before it was returned
        run: list[tuple[LevelMarker, tuple[str, str] | None]] = []
        try:
            for message in messages:
                if message.error() is not None:
                    continue
                key = (message.topic() or "", message.partition() or 0)
                self._read_to[key] = max(self._read_to.get(key, -1), (message.offset() or 0) + 1)
                try:
                    if key[0] == self._markers_topic:
                        read = self._marker_read(message, consumer, batch)
                        if read is not None:
                            run.append(read)
                    else:
                        if run:  # filed first: an answer meets the markers read before it
                            self._file(run)
                            run = []
                        self._answer(message)
                except _CountsUnreadError:
                    raise
                except Exception:  # one record never stops the reader
                    self._m_errors.inc()
                    log.exception(
                        "markers: a record at %s@%d could not be read", key, message.offset()
                    )
        finally:
            if run:
                self._file(run)

    def _file(self, run: list[tuple[LevelMarker, tuple[str, str] | None]]) -> None:
        for marker, exc in self._book.file_run(run):
            self._m_errors.inc()
            log.error(
                "markers: a record at %s@%d could not be read",
                (marker.topic, marker.partition),
                marker.offset,
                exc_info=exc,
            )

    def _marker_read(
        self, message: Message, consumer: Any, batch: int
    ) -> tuple[LevelMarker, tuple[str, str] | None] | None:
        """The marker `message` holds, with its refusal, to be filed (None: it is no
        marker). `batch`: the number of the batch holding `message` (`_batches`)."""
        read = marker_of(message)
        if read is None:
            self._metrics.level_markers.labels("-", "none", REFUSED).inc()
            if self._throttle.allow("not a marker") is not None:
                log.warning(
                    "markers: a record on %s without %s or %s is ignored",
                    self._markers_topic,
                    H_CANCEL,
                    H_RESCHEDULE,
                )
            return None
        marker, refusal = read
        stale = self._counts_after < batch
        if refusal is None and stale and self._book.beyond_count(marker.message_id):
            # Its message may be on a partition added since the counts were read.
            try:
                self._read_metadata(self._lister if self._lister is not None else consumer)
            except Exception as exc:
                raise _CountsUnreadError(f"{marker.message_id}: {exc!r}") from exc
        if refusal is None:
            self._place(marker.message_id, message.partition() or 0)
        return read

    def _place(self, message_id: str, partition: int) -> None:
        """A marker found on a markers partition other than its level partition's (an
        older SDK spread them by a hash of the id): that partition's records wait for
        this one's reading too, from now on, and a WARNING says so once."""
        named = tail_partition(message_id)
        if named is None or named >= max(self._book.partitions.values(), default=0):
            return  # no partition any level topic has: concerns no record (and bounds the gate)
        if partition in self._gate.home_of(named):
            return
        if level_place(message_id) is None:
            return  # no level id: answered `unmatched`, concerns no record
        homes = list(self._gate.home_of(named))
        self._gate.misplaced(named, partition)
        self._metrics.level_markers_misplaced.inc()
        if self._throttle.allow("misplaced") is not None:
            log.warning(
                "markers: a marker of level partition %d was on %s partition %d, not %s:"
                " written by an older SDK, or while the topic had fewer partitions; that"
                " level partition's records now wait for this one's reading too (upgrade"
                " every producer: docs/operations.md)",
                named,
                self._markers_topic,
                partition,
                homes,
            )

    def _answer(self, message: Message) -> None:
        reply = parse_reply(message.value())
        key = message.key()
        if reply is None or key is None or not key.startswith(f"{self._markers_topic}:".encode()):
            return
        _, stamp = message.timestamp()
        # Never later than now: an answer stamped ahead (a clock, a forger) would
        # outlive the window it is kept for.
        self._book.answer_read(key, reply, min(stamp, self._now_ms()))

    def _forget(self, now_ms: int) -> None:
        """Drop what no waiting record can need, and say how much is kept."""
        before = now_ms - self._window_ms
        need = self._gate.earliest_need()
        if need is not None:
            before = min(before, need)
        if self._book.expire(before):
            self._gate.forget_before(before)
        kept = self._book.kept()
        self._metrics.level_markers_book_bytes.set(self._book.total_bytes)
        for kind in (CANCEL, RESCHEDULE):
            self._metrics.level_markers_kept.labels(kind).set(kept.get(kind, 0))
        lag_ms = now_ms - self._gate.through_ms
        self._metrics.level_markers_lag.set(max(0.0, lag_ms / 1000))
