"""Filing what the marker reader reads: each record of the markers topic as a marker
(or a refusal) into the book, a run at a time, and each answer read back from the
outcomes topic after the markers read before it.

Apart from the reader's loop because this is where what anyone may write meets the
book: a record that is no marker, an id that is not UTF-8, a partition the level
topics lack (their counts are read again first: the topic may have grown), a marker on
another markers partition than its id's. None of it stops the reader, and none of it
is skipped: a marker it cannot read (no id, an id that is not UTF-8, a new time that is
not a number) is filed as refused, with the reason, and answered by the owner of the
first level's partition 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Final

from confluent_kafka import Message

from delayservice.envelope import H_CANCEL, H_RESCHEDULE
from delayservice.forward.buffer import TP
from delayservice.kafka.record_headers import UNREADABLE, read_headers
from delayservice.level.markers.book import MarkerBook
from delayservice.level.markers.gate import MarkerGate
from delayservice.level.markers.placing import REFUSED
from delayservice.level.markers.topics import PASS_TIMEOUT_S
from delayservice.level.markers.verdict import LevelMarker
from delayservice.log_throttle import Throttle
from delayservice.markers.level_ids import level_place, tail_partition
from delayservice.markers.replies import CANCEL, RESCHEDULE, parse_reply
from delayservice.markers.requests import BadMarkerError, reschedule_request
from delayservice.metrics.service_metrics import ServiceMetrics

log = logging.getLogger(__name__)

METADATA_S: Final = 60.0
"""How often the level topics' partition counts are read again; a marker naming a
partition beyond them has them read again before it is refused (`_marker_read`)."""


class CountsUnreadError(Exception):
    """The level topics' partition counts could not be read again for a marker naming a
    partition past them: the marker is read again by a fresh consumer, never skipped."""


def marker_of(message: Message) -> tuple[LevelMarker, tuple[str, str] | None] | None:
    """A record of the markers topic as a marker, with its refusal (outcome, reason) if
    it asks nothing a daemon can do; None for a record that is no marker at all."""
    _, appended = message.timestamp()
    where = (message.topic() or "", message.partition() or 0, message.offset() or 0)
    headers = read_headers(message)
    if headers is UNREADABLE or not isinstance(headers, list):
        return LevelMarker(CANCEL, "", appended, *where), (REFUSED, "its headers cannot be read")
    kind, raw = None, None  # in one pass: the first cancel, else the first reschedule
    for header, value in headers:
        if header == H_CANCEL and kind != CANCEL:
            kind, raw = CANCEL, value
        elif header == H_RESCHEDULE and kind is None:
            kind, raw = RESCHEDULE, value
    if kind is None:
        return None
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


class MarkerFiling:
    def __init__(
        self,
        markers_topic: str,
        level_topics: list[str],
        book: MarkerBook,
        gate: MarkerGate,
        metrics: ServiceMetrics,
        now_ms: Callable[[], int],
        read_to: dict[TP, int],
    ) -> None:
        """`read_to`: the reader's position per partition, moved past each record read."""
        self._markers_topic = markers_topic
        self.level_topics = level_topics
        self._book = book
        self._gate = gate
        self._metrics = metrics
        self.m_errors = metrics.loop_errors.labels("markers", "reader")
        self._now_ms = now_ms
        self._read_to = read_to
        self._throttle = Throttle()
        self._batches = 0  # batches of records read so far
        self._counts_after = -1
        """How many batches had been read when the level topics' partition counts were
        last read: a marker of a later batch may name a partition added since."""
        self.next_counts = 0.0
        """When (monotonic) the level topics' counts are next read (`read_counts`)."""

    def read_counts(self, consumer: Any) -> None:
        """Read the level topics' partition counts (the book refuses a marker naming a
        partition past them)."""
        after = self._batches
        for topic in self.level_topics:
            meta = consumer.list_topics(topic, timeout=PASS_TIMEOUT_S).topics.get(topic)
            if meta is not None and meta.error is None and meta.partitions:
                self._book.partition_count(topic, len(meta.partitions))
        self._counts_after = after
        self.next_counts = time.monotonic() + METADATA_S

    def read(self, consumer: Any, messages: list[Message], lister: Any = None) -> None:
        """File what `messages` hold: markers into the book a run at a time, and each
        answer after the markers read before it. `lister`: the client that reads the
        level topics' counts again when a marker names a partition past them (None:
        `consumer`)."""
        self._batches += 1
        batch = self._batches  # every marker in it was appended before it was returned
        counts_from = consumer if lister is None else lister
        run: list[tuple[LevelMarker, tuple[str, str] | None]] = []
        read_to, markers_topic = self._read_to, self._markers_topic
        try:
            for message in messages:
                if message.error() is not None:
                    continue
                key = (message.topic() or "", message.partition() or 0)
                after = (message.offset() or 0) + 1
                if after > read_to.get(key, -1):
                    read_to[key] = after
                try:
                    if key[0] == markers_topic:
                        read = self._marker_read(message, counts_from, batch)
                        if read is not None:
                            run.append(read)
                    else:
                        if run:  # filed first: an answer meets the markers read before it
                            self._file(run)
                            run = []
                        self._answer(message)
                except CountsUnreadError:
                    raise
                except Exception as exc:  # one record never stops the reader
                    self._unreadable(key, message.offset() or 0, exc)
        finally:
            if run:
                self._file(run)

    def _file(self, run: list[tuple[LevelMarker, tuple[str, str] | None]]) -> None:
        if log.isEnabledFor(logging.DEBUG):
            first, last = run[0][0], run[-1][0]
            log.debug(
                "markers: filing %d, %s:%d@%d to %s:%d@%d",
                len(run),
                first.topic,
                first.partition,
                first.offset,
                last.topic,
                last.partition,
                last.offset,
            )
        for marker, exc in self._book.file_run(run):
            self._unreadable((marker.topic, marker.partition), marker.offset, exc)

    def _unreadable(self, tp: TP, offset: int, exc: Exception) -> None:
        """Count a record that could not be read or filed, and say why: at most one line
        per `Throttle` period, so a run of them (a bug meeting a flood) does not flood
        the log too."""
        self.m_errors.inc()
        held_back = self._throttle.allow("unreadable")
        if held_back is not None:
            log.error(
                "markers: a record at %s@%d could not be read%s",
                tp,
                offset,
                f" ({held_back} more since the last line)" if held_back else "",
                exc_info=exc,
            )

    def _marker_read(
        self, message: Message, lister: Any, batch: int
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
        if refusal is not None:
            return read
        message_id = marker.message_id
        named = tail_partition(message_id)  # once, for both questions below
        if named is None:
            return read  # no level id: answered `unmatched`, concerns no record
        if self._counts_after < batch and self._book.beyond_count(message_id, named):
            # Its message may be on a partition added since the counts were read.
            try:
                self.read_counts(lister)
            except Exception as exc:
                raise CountsUnreadError(f"{message_id}: {exc!r}") from exc
        self._place(message_id, marker.partition, named)
        return read

    def _place(self, message_id: str, partition: int, named: int) -> None:
        """A marker found on a markers partition other than its level partition's (an
        older SDK spread them by a hash of the id): that partition's records wait for
        this one's reading too, from now on, and a WARNING says so once. `named`: the
        level partition its id ends with (`tail_partition`)."""
        if self._book.past_every_count(named):
            return  # no partition any level topic has: concerns no record (and bounds the gate)
        if self._gate.is_home(named, partition):
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
