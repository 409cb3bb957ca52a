"""`delayservice find ID`: where one message is now.

The message's own record says when it is due and where it goes; then its target says
whether it was forwarded, the dead-letter topic whether it was given up, and for
precise mode its partition which cancels and reschedules were written, and the
outcomes topic what the daemon did with each (`marker_trail`): a moved message is due
when its last move says. An exact id names its partition of the precise topic, so
only that partition is read; so does a level id (its level and partition), from the
time it says it was sent, and its markers are on the markers topic, answered on its
outcomes topic. An id of another form may be on any level, so every level partition in
the window is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from delayservice.envelope import H_CANCEL, H_ID, H_RESCHEDULE, H_TARGET
from delayservice.forward import dead_letter as dl
from delayservice.kafka import client_config
from delayservice.markers.level_ids import level_place
from delayservice.markers.precise_ids import named_place
from delayservice.markers.replies import CANCEL, RESCHEDULE
from delayservice.precise.precise_worker import FAR_LEVEL_NAME, LEVEL_NAME
from delayservice.settings import Settings
from delayservice.status.kafka_backlog import Head
from delayservice.status.marker_trail import Marker, calls_off, moved_due_ms, read_replies
from delayservice.status.pending_report import level_due_ms, precise_due_ms
from delayservice.status.topic_scan import Headers, Hit, TopicScan, header_text

WAITING = "waiting"
OVERDUE = "overdue"
FORWARDED = "forwarded"
DEAD_LETTERED = "dead-lettered"
CANCELLED = "cancelled"
NOT_FOUND = "not found"


@dataclass
class Whereabouts:
    message_id: str
    state: str
    since_ms: int
    now_ms: int
    level: str | None = None
    source: Hit | None = None
    due_ms: int | None = None
    target: str | None = None
    forwarded: list[Hit] = field(default_factory=list)
    dead_letters: list[Hit] = field(default_factory=list)
    cancels: list[Marker] = field(default_factory=list)
    reschedules: list[Marker] = field(default_factory=list)
    original_due_ms: int | None = None
    """The due time the message was sent with; `due_ms` is the last move's, if any."""
    outcomes_topic: str | None = None  # where replies to its markers are read from
    outcomes_read: bool | None = None  # None: no marker to ask about; False: no such topic
    searched: list[str] = field(default_factory=list)
    records_read: int = 0

    def as_json(self) -> dict[str, Any]:
        def hit(h: Hit) -> dict[str, Any]:
            return {
                "topic": h.topic,
                "partition": h.partition,
                "offset": h.offset,
                "timestamp_ms": h.timestamp_ms,
            }

        return {
            "id": self.message_id,
            "state": self.state,
            "level": self.level,
            "due_ms": self.due_ms,
            "original_due_ms": self.original_due_ms,
            "target": self.target,
            "source": hit(self.source) if self.source else None,
            "forwarded": [hit(h) for h in self.forwarded],
            "dead_lettered": [
                {**hit(h), "reason": h.headers.get(dl.H_REASON, b"").decode(errors="replace")}
                for h in self.dead_letters
            ],
            "cancels": [m.as_json() for m in self.cancels],
            "reschedules": [m.as_json() for m in self.reschedules],
            "outcomes_topic": self.outcomes_topic,
            "outcomes_read": self.outcomes_read,
            "searched_since_ms": self.since_ms,
            "searched": self.searched,
            "records_read": self.records_read,
        }


def find(
    settings: Settings,
    message_id: str,
    since_ms: int,
    now_ms: int,
    on_read: Callable[[int], None] | None = None,
) -> Whereabouts:
    """Where `message_id` is, reading records appended since `since_ms`."""
    out = Whereabouts(message_id, NOT_FOUND, since_ms, now_ms)
    scan = TopicScan(client_config.common(settings))
    try:
        _locate(scan, settings, out, on_read)
        if out.source is not None:
            _follow(scan, settings, out, on_read)
    finally:
        out.records_read = scan.records_read
        scan.close()
    return out


def _is(message_id: str) -> Callable[[Headers], bool]:
    def match(headers: Headers) -> bool:
        return header_text(headers, H_ID) == message_id

    return match


@dataclass(frozen=True)
class PreciseHome:
    """Where an exact message and its markers are, and where the daemon answers them."""

    topic: str
    partition: int
    outcomes_topic: str
    far: bool = False


def precise_home(settings: Settings, message_id: str) -> PreciseHome | None:
    """The precise topic (or the far one) and partition an exact id names; None for any
    other id, or with precise mode off."""
    place = named_place(message_id)
    if not settings.precise or place is None:
        return None
    topic = settings.precise_far_topic if place.far else settings.precise_topic
    return PreciseHome(topic, place.partition, settings.precise_outcomes_topic, place.far)


def _locate(
    scan: TopicScan, settings: Settings, out: Whereabouts, on_read: Callable[[int], None] | None
) -> None:
    """Find the message's own record (and, in precise mode, its markers)."""
    home = precise_home(settings, out.message_id)
    if home is not None and _locate_exact(scan, home, out, on_read):
        return
    if _locate_level(scan, settings, out, on_read):
        return
    message_id = out.message_id
    for level in settings.level_set():
        partitions = scan.partitions(level.topic)
        if partitions is None:
            continue
        out.searched.append(level.topic)
        found = scan.scan(
            level.topic,
            scan.planned(level.topic, partitions, out.since_ms),
            _is(message_id),
            on_read,
        )
        if found:
            out.source, out.level = found[0], level.name
            out.original_due_ms = out.due_ms = level_due_ms(level, _head(found[0]))
            return


def _locate_exact(
    scan: TopicScan, home: PreciseHome, out: Whereabouts, on_read: Callable[[int], None] | None
) -> bool:
    """Read the partition an exact id names for the message and its markers, then the
    replies to them; False when the message is not there."""
    message_id = out.message_id
    plan = scan.planned(home.topic, [home.partition], out.since_ms)
    out.searched.append(f"{home.topic}[{home.partition}]")

    def ours(headers: Headers) -> bool:
        return (
            header_text(headers, H_ID) == message_id
            or header_text(headers, H_CANCEL) == message_id
            or header_text(headers, H_RESCHEDULE) == message_id
        )

    for hit in scan.scan(home.topic, plan, ours, on_read):
        if H_CANCEL in hit.headers:
            out.cancels.append(Marker(CANCEL, hit))
        elif H_RESCHEDULE in hit.headers:
            out.reschedules.append(Marker(RESCHEDULE, hit))
        elif out.source is None:
            out.source, out.level = hit, (FAR_LEVEL_NAME if home.far else LEVEL_NAME)
    if out.source is None:
        return False
    out.original_due_ms = out.due_ms = precise_due_ms(_head(out.source))
    _answers_and_move(scan, out, home.outcomes_topic, on_read)
    return True


SKEW_MS = 300_000
"""How far before the send time a level id names its message is looked for (the
producer's clock against the broker's)."""


def _locate_level(
    scan: TopicScan, settings: Settings, out: Whereabouts, on_read: Callable[[int], None] | None
) -> bool:
    """Read the level partition a level id names for the message, the markers topic for
    its markers, then the answers to them; False when the id names no level here or the
    message is not there."""
    place = level_place(out.message_id)
    levels = settings.level_set().levels
    if place is None or place.level > len(levels):
        return False
    level = levels[place.level - 1]
    since = max(out.since_ms, place.sent_ms - SKEW_MS)
    message_id = out.message_id
    out.searched.append(f"{level.topic}[{place.partition}]")
    plan = scan.planned(level.topic, [place.partition], since)
    found = scan.scan(level.topic, plan, _is(message_id), on_read)
    if not found:
        return False
    out.source, out.level = found[0], level.name
    out.original_due_ms = out.due_ms = level_due_ms(level, _head(found[0]))

    def ours(headers: Headers) -> bool:
        return (
            header_text(headers, H_CANCEL) == message_id
            or header_text(headers, H_RESCHEDULE) == message_id
        )

    markers_topic = settings.markers_topic
    partitions = scan.partitions(markers_topic)
    if partitions is not None:
        out.searched.append(markers_topic)
        for hit in scan.scan(markers_topic, scan.planned(markers_topic, partitions, since), ours,
                             on_read):  # fmt: skip
            kind = CANCEL if H_CANCEL in hit.headers else RESCHEDULE
            (out.cancels if kind == CANCEL else out.reschedules).append(Marker(kind, hit))
    _answers_and_move(scan, out, settings.markers_outcomes_topic, on_read)
    return True


def _answers_and_move(
    scan: TopicScan,
    out: Whereabouts,
    outcomes_topic: str,
    on_read: Callable[[int], None] | None,
) -> None:
    """Both modes: the daemon's answers to the markers found, and the due time the last
    reschedule set."""
    markers = [*out.cancels, *out.reschedules]
    if markers:
        out.outcomes_topic = outcomes_topic
        out.outcomes_read = read_replies(scan, outcomes_topic, markers, on_read)
        if out.outcomes_read:
            out.searched.append(outcomes_topic)
    moved = moved_due_ms(out.reschedules)
    if moved is not None:
        out.due_ms = moved


def _head(hit: Hit) -> Head:
    return Head(hit.offset, 0, hit.timestamp_ms, hit.headers)


def _follow(
    scan: TopicScan, settings: Settings, out: Whereabouts, on_read: Callable[[int], None] | None
) -> None:
    """From the message's own record: its copies on the target and dead-letter topics."""
    source = out.source
    assert source is not None
    out.target = source.headers.get(H_TARGET, b"").decode(errors="replace") or None
    origin = (source.topic.encode(), str(source.partition).encode(), str(source.offset).encode())

    def dead(headers: Headers) -> bool:
        values = dict(headers)
        if (
            values.get(dl.H_ORIGIN_TOPIC),
            values.get(dl.H_ORIGIN_PARTITION),
            values.get(dl.H_ORIGIN_OFFSET),
        ) == origin:
            return True
        return header_text(headers, H_ID) == out.message_id

    since = source.timestamp_ms  # no copy is older than the record it copies
    for topic, keep, into in (
        (out.target, _is(out.message_id), out.forwarded),
        (settings.dead_letter_topic, dead, out.dead_letters),
    ):
        if not topic:
            continue
        partitions = scan.partitions(topic)
        if partitions is None:
            continue
        out.searched.append(topic)
        into.extend(scan.scan(topic, scan.planned(topic, partitions, since), keep, on_read))
    if out.forwarded:
        out.state = FORWARDED
    elif out.dead_letters:
        out.state = DEAD_LETTERED
    elif calls_off(out.cancels):
        out.state = CANCELLED
    elif out.due_ms is not None and out.due_ms <= out.now_ms:
        out.state = OVERDUE
    else:
        out.state = WAITING
