"""The thread that reads the level markers topic and its outcomes topic, one per process.

It owns one consumer, assigned every partition of both topics (no group: nothing here
is committed, so a kill -9 loses nothing). At start it reads from twice the top
level's delay ago, and again from earlier whenever a partition group holds older
records (`MarkerGate.need`). Each partition is read to a target of its own: the
reader notes the time, asks the broker where the partition ends, and reads up to
there; markers go to the book, answers mark what was answered and carried out, that
partition's gate moves to the time noted, and the forwarders with markers to serve are
woken (`on_pass`). Every partition gets a new target every `IDLE_PASS_S`, queued behind
those it has not reached yet, so a flood on one markers partition holds back only the
records whose markers go there (`MarkerGate.through_for`), and only until the markers
appended before their time are read, not the whole flood (`read_targets`). Each pass
also lists both topics' partitions again, after noting the time: a partition added
while the reader runs (the SDK spreads markers over the topic's current partitions) is
assigned from its beginning and read to its end before the gate moves past the time
noted. It passes when a group waits for the gate, when a rewind is asked for, and
otherwise every `IDLE_PASS_S`, so markers are answered promptly even while nothing is
due.

What a record holds is filed by `filing` (a marker it cannot read is filed as
refused, with the reason; nothing a marker carries stops the thread); partitions added
and a topic deleted and made again are followed by `topics`.

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
from typing import Any, Final

from confluent_kafka import Consumer, KafkaException

from delayservice.forward.buffer import TP
from delayservice.kafka import client_config
from delayservice.kafka.client_errors import STARTING_CODES, error_of, raised_by
from delayservice.kafka.log_levels import GraceStreaks
from delayservice.level.markers.book import MarkerBook
from delayservice.level.markers.ends import PartitionEnds
from delayservice.level.markers.filing import MarkerFiling
from delayservice.level.markers.gate import MarkerGate
from delayservice.level.markers.read_targets import ReadTargets, Target
from delayservice.level.markers.topics import (
    PASS_TIMEOUT_S,
    MarkerTopics,
    TopicIds,
    TopicRemadeError,
    admin_topic_ids,
)
from delayservice.log_throttle import Throttle
from delayservice.markers.replies import CANCEL, RESCHEDULE
from delayservice.metrics.heartbeat import STUCK_S, Heartbeat
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.settings import Settings

log = logging.getLogger(__name__)

IDLE_PASS_S: Final = 0.1
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
FLOOD_NUDGE_S: Final = 1.0
"""While a partition is still being read to its target (a flood), how often the
forwarders are told of what the others' reads filed: each tells them to serve the
markers, and serving a flood's after each batch would slow its reading tenfold."""

FORGET_S: Final = 1.0
"""How often a pass still reading (behind a flood) does its end's `_forget` meanwhile."""

MakeConsumer = Callable[[dict[str, Any]], Any]


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
        self._markers_topic = settings.markers_topic
        self._metrics = metrics
        self._m_errors = metrics.loop_errors.labels(self.name, "reader")
        self._stopping = threading.Event()
        self._throttle = Throttle()
        self._starting = GraceStreaks()
        self._read_to: dict[TP, int] = {}
        self.filing = MarkerFiling(
            self._markers_topic,
            [level.topic for level in levels],
            book,
            gate,
            metrics,
            now_ms,
            self._read_to,
        )
        self._next_pass = 0
        """When (epoch ms) the next pass is due while no group waits."""
        self._read_once = False
        self._targets = ReadTargets(self._markers_topic)
        """Per partition, the ends it must be read to before its gate moves to each
        target's time: kept across passes that run out of time, and one more noted
        every round (`IDLE_PASS_S`; `_next_round`, monotonic)."""
        # When (monotonic) the forwarders were last told of a read: `_nudged_at`.
        self._next_round = self._nudged_at = 0.0
        self._next_forget = 0.0  # when (monotonic) a pass still reading runs `_forget`
        self.heartbeat = Heartbeat()
        """Beats once per turn of the loop."""
        self._advanced_at = time.monotonic()
        """When the gate last moved: a pass's end, or a flood's reading passing the
        targets of the partition read least far (readiness: `health`)."""
        self._full_since: float | None = None
        """When the book reached its share and markers stopped being read (None: not)."""
        self._markers_paused = False
        real = topic_ids is None and make_consumer is Consumer
        self.topics = MarkerTopics(
            settings, book, gate, now_ms, admin_topic_ids(settings) if real else topic_ids
        )
        self._ends = PartitionEnds(make_consumer, self._config, self._markers_topic)
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
        if self.topics.remade is not None:
            return False, (
                f"markers: {self.topics.remade} was deleted and made again; reading the new one"
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
        self._ends.close()

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
        if isinstance(exc, TopicRemadeError):
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
            self.topics.assign_all(consumer, self._read_to)
            self.filing.read_counts(consumer)
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
            consumer.assign(self.topics.starts(consumer, since, self._read_to))
        except:  # a bare KafkaError too (kafka.client_errors)
            consumer.close()
            raise
        log.info(
            "markers: reading %s and %s from %d%s",
            *self.topics.names,
            since,
            " again, for a partition holding older records" if rewind is not None else "",
        )
        self._next_pass = 0  # at once
        self._targets.clear()  # positions start over: so do the targets
        self._markers_paused = False
        return consumer

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
            if time.monotonic() >= self.filing.next_counts:
                self.filing.read_counts(consumer)
            self._pass(consumer)
        except KafkaException as exc:  # a broker away: the gate waits, and so does forwarding
            if self._throttle.allow("broker") is not None:
                log.warning("markers: %s; reading again", exc)
            self._stopping.wait(ERROR_PAUSE_S)

    def _pass(self, consumer: Any) -> None:
        """Give each partition a target (note the time, follow partitions added since,
        find where they end), read, and move each partition's gate as it passes its
        targets; every `IDLE_PASS_S` each gets one more. A pass that runs out of time
        returns and the next goes on to the same targets; while one partition is
        flooded, the others' records go on, and the flooded one's as its reading passes
        the ends noted before their time."""
        generation = self._gate.generation
        self._targets.clear_if_older(generation)
        self._top_up(consumer)
        deadline = time.monotonic() + PASS_TIMEOUT_S
        while self._markers_pending():
            if self._stopping.is_set():
                return
            if self._book_full(consumer):
                return  # the gate stays where it was: forwarding waits, never early
            self.filing.read(
                consumer, consumer.consume(BATCH, POLL_S), self._ends.lister
            )  # a batch at least, every pass
            self._note_positions(consumer)
            self._settle()
            if not self._markers_pending():
                break
            if time.monotonic() > deadline:
                return  # the gate stays where it was: forwarding waits, never early
            if time.monotonic() >= self._next_round:
                self._top_up(consumer)
            if time.monotonic() >= self._next_forget:  # a pass behind a flood goes on
                self._forget(self._now_ms())
        # What else is queued (answers, mostly), for a moment only: a flood that began
        # after the targets were noted keeps the queue full, and drained to its end it
        # kept every partition's gate where it was until the flood was read.
        until = time.monotonic() + IDLE_PASS_S
        for message_batch in iter(lambda: consumer.consume(BATCH, 0), []):
            self.filing.read(consumer, message_batch, self._ends.lister)
            if time.monotonic() >= until:
                break
        self._note_positions(consumer)
        self._settle()
        if self.topics.remade is not None:
            log.info("markers: %s, made again, read through", self.topics.remade)
            self.topics.remade = None
        self._read_once = True
        self._advanced_at = time.monotonic()
        self._next_pass = self._now_ms() + int(IDLE_PASS_S * 1000)
        self._forget(self._now_ms())

    def _markers_pending(self) -> bool:
        return self._targets.markers_pending()

    def _settle(self) -> None:
        """Move the gate of each partition read to its target, and tell the forwarders."""
        now = time.monotonic()
        reached = self._targets.passed(self._read_to, now)
        through = self._gate.through_ms
        for generation, (markers, outcomes) in reached.items():
            log.debug(
                "markers: read through %s, answers %s (gate %d)", markers, outcomes, generation
            )
            self._gate.advance_parts(markers, outcomes, generation)
        if not reached:
            return
        if self._gate.through_ms > through:
            self._advanced_at = now  # readiness: the gate moves, if only behind a flood
            # Read once: every markers partition passed a target (a pass behind a flood
            # that goes on being written ends only once it is read).
            self._read_once = self._read_once or self._gate.through_ms >= 0
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
        markers = [tp for tp in self.topics.assigned if tp.topic == self._markers_topic]
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
        self.filing.read(consumer, consumer.consume(BATCH, POLL_S), self._ends.lister)
        for message_batch in iter(lambda: consumer.consume(BATCH, 0), []):
            self.filing.read(consumer, message_batch, self._ends.lister)
        self._note_positions(consumer)
        self._next_pass = self._now_ms() + int(IDLE_PASS_S * 1000)
        return True

    def _top_up(self, consumer: Any) -> None:
        """Note the time, then where each partition ends: every marker acknowledged
        before that time is below those ends. Partitions added since are followed
        first, from their beginning. The ends are asked of the idle lister: asked of
        the reading consumer, each waits behind its fetch."""
        generation = self._gate.generation
        began = self._now_ms()
        self._report_lag(began)
        self._next_round = time.monotonic() + IDLE_PASS_S
        # Asked for after `began`.
        listed = {topic: self._ends.partitions(topic) for topic in self.topics.names}
        ends = self.topics.follow_growth(consumer, listed, self._read_to)
        for assigned in self.topics.assigned:  # `ends` has why the outcomes' are asked again
            key = (assigned.topic, assigned.partition)
            if key not in ends or assigned.topic != self._markers_topic:
                ends[key] = self._ends.end_of(assigned)
        if self.topics.check_ids(self._read_to):  # asked after the ends: the topics read
            raise TopicRemadeError
        log.debug("markers: at %d, read to %s (gate %d)", began, ends, generation)
        for tp, end in ends.items():
            self._targets.note(tp, Target(began, end, generation))

    def _note_positions(self, consumer: Any) -> None:
        """Where each partition's reading got to: the consumer's position steps over
        the transaction markers that end the outcomes topic."""
        for tp in consumer.position(self.topics.assigned):
            key = (tp.topic, tp.partition)
            if tp.offset >= 0 and tp.offset > self._read_to.get(key, -1):
                self._read_to[key] = tp.offset

    def _forget(self, now_ms: int) -> None:
        """Drop what no waiting record can need, and say how much is kept."""
        self._next_forget = time.monotonic() + FORGET_S
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
        self._report_lag(now_ms)

    def _report_lag(self, now_ms: int) -> None:
        """How far behind now the partition read least far is read through; also every
        round (`_top_up`), since a pass behind a flood does not end until it is read."""
        lag_ms = now_ms - self._gate.through_ms
        self._metrics.level_markers_lag.set(max(0.0, lag_ms / 1000))
        answers_ms = now_ms - self._gate.outcomes_through_ms
        self._metrics.level_markers_answers_lag.set(max(0.0, answers_ms / 1000))
