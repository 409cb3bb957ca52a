"""The verdict of a scenario, computed from what the broker holds, not from the daemon.

Every record on a level topic is a source. Its due time is computed here, independently
of the daemon: due = its append time on the level topic (LogAppendTime, the broker's
clock) + max(level delay, `delay-ms`). Its envelope is judged by the documented format
(docs/envelope.md), strictly: `delay-v` is exactly `1`, numbers are ASCII decimal
digits, text is UTF-8, every `delay-*` header appears once. A source then has to show
up on its target (matched by `delay-id`) or on the dead-letter topic (matched by the
`dlq-origin-*` headers, because many hostile records have no usable id).

In precise mode a reschedule marker on the partition of a message, appended before the
message was due, moves its due time to max(the marker's append time + `delay-ms`,
`delay-due-ms`), in marker order; the scenarios send them in time. A delivery that
carries a due time a later marker replaced is `superseded`.

Level messages' markers are on the markers topic, by id. One appended before the
message's due time acts on it, in append order: a cancel makes it cancelled (judged
apart: it must never arrive), a reschedule moves its due time to the time asked (the
copy the daemon re-publishes, marked `delay-moved-by`, is not a source of its own: it
is the same message, and its delivery is judged against the time asked, which the
copy's level may round up but never down).
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from delayservice import partitioners
from tests.faults.harness import Produced, Reader, Rec

ENVELOPE_PREFIX = "delay-"
LONG_MAX = 2**63 - 1
LARGE_BYTES = 512 * 1024
"""Above this a valid record may be refused as too large; either outcome is fine."""
LOG_APPEND_TIME = 2  # confluent_kafka.TIMESTAMP_LOG_APPEND_TIME
_DIGITS = re.compile(rb"[0-9]+")


@dataclass(frozen=True)
class Topology:
    """The topics of one scenario: which exist, which are plain targets."""

    levels: dict[str, int]  # level topic -> delay ms
    dead_letter_topic: str
    targets: dict[str, int]  # plain target topic -> partitions
    partitions: int  # of the level and dead-letter topics
    precise: tuple[str, ...] = ()  # the precise and far topics, when precise mode is on
    max_delay_ms: int = 0  # precise mode's longest delay
    markers: str | None = None  # the level markers topic
    cancel_lead_ms: int = 0  # within this of a due time, a level marker races the forward

    @classmethod
    def of(cls, settings: Any, targets: dict[str, int]) -> Topology:
        return cls(
            {lv.topic: lv.delay_ms for lv in settings.level_set()},
            settings.dead_letter_topic,
            dict(targets),
            settings.partitions,
            (settings.precise_topic, settings.precise_far_topic) if settings.precise else (),
            settings.max_delay_ms if settings.precise else 0,
            settings.markers_topic,
            settings.cancel_lead_ms,
        )

    @property
    def top_ms(self) -> int:
        return max(*self.levels.values(), self.max_delay_ms)

    def sources(self) -> list[str]:
        """Topics whose records are delayed messages: the levels and the precise ones."""
        return [*self.levels, *self.precise]

    def existing(self) -> dict[str, int]:
        """Every topic a valid envelope may name: targets, levels and the dead-letter topic."""
        out = dict.fromkeys(self.sources(), self.partitions)
        out[self.dead_letter_topic] = self.partitions
        out.update(self.targets)
        return out

    def reads(self) -> list[str]:
        markers = [self.markers] if self.markers is not None else []
        return [*markers, *self.sources(), self.dead_letter_topic, *self.targets]


@dataclass(frozen=True)
class Expectation:
    """What must become of a source: `forward`, `dead` (dead-letter) or `either`."""

    kind: str
    why: str
    id: str | None = None
    target: str | None = None
    partition: int | None = None
    delay_ms: int = 0
    due_ms: int | None = None


def _number(raw: bytes | None) -> int | None:
    return int(raw) if raw is not None and _DIGITS.fullmatch(raw) else None


def _text(raw: bytes | None) -> str | None:
    if not raw:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return None


def expect(rec: Rec, topology: Topology) -> Expectation:
    """Judge a level-topic record's envelope by the documented format."""
    env: dict[str, bytes | None] = {}
    twice = None
    for name, value in rec.headers:
        if name.startswith(ENVELOPE_PREFIX):
            if name in env:
                twice = name
            env.setdefault(name, value)
    # The id of an invalid record too: if it is forwarded anyway, this finds the copy.
    message_id = _text(env.get("delay-id"))

    def dead(why: str) -> Expectation:
        return Expectation("dead", why, message_id)

    if twice is not None:
        return dead(f"{twice} appears twice")
    if env.get("delay-v") != b"1":
        return dead(f"delay-v is {env.get('delay-v', 'missing')!r}")
    target = _text(env.get("delay-target"))
    delay_ms = _number(env.get("delay-ms"))
    if message_id is None or target is None or delay_ms is None:
        return dead("delay-id, delay-target or delay-ms missing or malformed")
    partition = None
    if "delay-partition" in env:
        partition = _number(env["delay-partition"])
        if partition is None:
            return dead(f"delay-partition is {env['delay-partition']!r}")
    due_ms = _number(env["delay-due-ms"]) if "delay-due-ms" in env else None
    if "delay-due-ms" in env and due_ms is None:
        return dead(f"delay-due-ms is {env['delay-due-ms']!r}")
    partitioner = _text(env.get("delay-partitioner"))
    if "delay-partitioner" in env and partitioner not in partitioners.NAMES:
        return dead(f"delay-partitioner is {env['delay-partitioner']!r}")
    if delay_ms > LONG_MAX:
        return dead(f"delay-ms {delay_ms} does not fit a long")
    existing = topology.existing()
    if target not in existing:
        return dead(f"target {target[:40]!r} does not exist")
    if partition is not None and partition >= existing[target]:
        return dead(f"partition {partition} of {target} does not exist")
    if partition is None:  # where an undelayed send through its producer would land
        partition = partitioners.place(partitioner, rec.key, existing[target])
    plain = target in topology.targets and delay_ms <= topology.top_ms and _size(rec) < LARGE_BYTES
    return Expectation(
        "forward" if plain else "either", "valid", message_id, target, partition, delay_ms, due_ms
    )


def _size(rec: Rec) -> int:
    size = len(rec.key or b"") + len(rec.value or b"")
    return size + sum(len(n.encode()) + len(v or b"") for n, v in rec.headers)


def user_headers(headers: tuple[tuple[str, bytes | None], ...]) -> list[tuple[str, Any]]:
    return [(n, v) for n, v in headers if not n.startswith(ENVELOPE_PREFIX)]


@dataclass
class Source:
    """One record on a level topic and everything that became of it."""

    rec: Rec
    produced: Produced | None  # None: not acknowledged to our producers
    expect: Expectation
    due_ms: int | None
    echo: bool = False  # a copy the daemon forwarded into a level topic
    replaced: tuple[int, ...] = ()  # due times reschedules replaced, in order
    cancelled: bool = False  # a level message whose cancel was appended before it was due
    raced: bool = False  # a level marker within `cancel_lead` of its due time: either outcome
    level_moved: bool = False  # a level message a reschedule moved (a copy, level-rounded)
    deliveries: list[Rec] = field(default_factory=list)
    dead: list[Rec] = field(default_factory=list)
    copies: list[Rec] = field(default_factory=list)  # a level message's moves, as committed

    @property
    def good(self) -> bool:
        return self.produced is not None and self.produced.good

    @property
    def first_delivery(self) -> Rec | None:
        return min(self.deliveries, key=lambda r: r.ts) if self.deliveries else None

    def where(self) -> str:
        r = self.rec
        return f"{r.topic}[{r.partition}]@{r.offset} ({self.expect.why})"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(repr=False)
class Report:
    """The numbers of one scenario, and every violation found, by kind."""

    scenario: str
    sources: list[Source]
    missing: list[str]  # acknowledged to our producer, absent from the level topic
    wrong: list[str]  # misrouted, altered, orphaned or stray records
    dead_reasons: Counter[str]
    recovery_s: float | None = None
    notes: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)  # the daemons' log files, for a failure
    cancelled: list[Source] = field(default_factory=list)  # withdrawn in time: none may arrive
    raced: list[Source] = field(default_factory=list)  # a marker within the lead: not judged

    def __repr__(self) -> str:
        """Short, because pytest prints it in every failed assertion."""
        return f"<Report {self.row()}>"

    @property
    def stubs(self) -> int:
        return sum(1 for s in self.sources for d in s.dead if d.header("dlq-stub") == b"1")

    @property
    def accounted(self) -> int:
        return sum(1 for s in self.sources if s.deliveries or s.dead)

    @property
    def ours(self) -> list[Source]:
        return [s for s in self.sources if s.produced is not None]

    @property
    def lost(self) -> list[str]:
        gone = [s.where() for s in self.sources if not s.deliveries and not s.dead]
        return self.missing + gone

    @property
    def cancels_leaked(self) -> list[str]:
        """Messages cancelled in time and delivered all the same."""
        return [f"{s.where()} ({s.expect.id})" for s in self.cancelled if s.deliveries]

    @property
    def duplicates(self) -> int:
        judged = [*self.sources, *self.raced]  # a race decides whether, never how many times
        return sum(max(0, len(s.deliveries) + len(s.dead) - 1) for s in judged)

    @property
    def dead_letters_repeated(self) -> int:
        """Dead letters beyond the first of each source (counted in `duplicates` too):
        exactly-once promises one per record, at-least-once may repeat some."""
        judged = [*self.sources, *self.raced]
        return sum(max(0, len(s.dead) - 1) for s in judged)

    @property
    def dead_lettered(self) -> int:
        return sum(1 for s in self.ours if s.dead and not s.deliveries)

    @property
    def early(self) -> list[str]:
        return [
            f"{s.where()} reached {d.topic} {s.due_ms - d.ts} ms before due"
            for s in self.sources
            if s.due_ms is not None
            for d in s.deliveries
            if d.ts < s.due_ms
        ]

    @property
    def superseded(self) -> list[str]:
        """Deliveries at a due time a reschedule had replaced. A move may ask for the
        very millisecond it replaced (a CI run of row 31 did): a delivery for the due
        time in force is not superseded, whatever it replaced."""
        return [
            f"{s.where()} ({s.expect.id}) delivered for {due}, moved to {s.due_ms}"
            for s, due in self._superseded()
        ]

    @property
    def superseded_ids(self) -> set[str]:
        return {s.expect.id for s, _ in self._superseded()}

    def _superseded(self) -> list[tuple[Source, int]]:
        return [
            (s, due)
            for s in self.sources
            for d in s.deliveries
            if (due := _number(d.header("delay-due-ms"))) is not None
            and due in s.replaced
            and due != s.due_ms
        ]

    @property
    def moved(self) -> list[Source]:
        return [s for s in self.sources if s.replaced]

    @property
    def lateness_s(self) -> list[float]:
        return [
            (first.ts - s.due_ms) / 1000
            for s in self.sources
            if s.due_ms is not None and (first := s.first_delivery) is not None
        ]

    def lateness_where(self, keep: Callable[[Source], bool]) -> list[float]:
        return [
            (first.ts - s.due_ms) / 1000
            for s in self.sources
            if keep(s) and s.due_ms is not None and (first := s.first_delivery) is not None
        ]

    def row(self) -> dict[str, str]:
        late = self.lateness_s
        p99, worst = percentile(late, 0.99), max(late, default=None)
        leaked = f"{len(self.cancels_leaked)} of {len(self.cancelled)} cancels leaked"
        cancels = [leaked] if self.cancelled else []
        if self.raced:
            cancels.append(f"{len(self.raced)} raced a marker within the lead")
        if self.moved:
            twice = sum(1 for s in self.moved if len(s.deliveries) > 1)
            cancels.append(
                f"{len(self.moved)} rescheduled: {len(self.superseded)} at a superseded "
                f"time, {twice} twice"
            )
        if self.dead_letters_repeated:
            cancels.append(f"{self.dead_letters_repeated} of the duplicates are dead letters")
        return {
            "scenario": self.scenario,
            "records": str(len(self.ours)),
            "lost": str(len(self.lost)),
            "duplicates": str(self.duplicates),
            "dead-lettered": str(self.dead_lettered),
            "early": str(len(self.early)),
            "p99 lateness": _seconds(p99),
            "max lateness": _seconds(worst),
            "recovery": _seconds(self.recovery_s),
            "notes": "; ".join(
                [
                    *cancels,
                    *self.notes,
                    *([f"{len(self.wrong)} misrouted/altered"] if self.wrong else []),
                ]
            ),
        }

    def problems(self) -> str:
        """Up to five examples of each kind of violation, for an assertion message."""
        parts = []
        for kind, items in (
            ("lost", self.lost),
            ("early", self.early),
            ("wrong", self.wrong),
            ("cancels leaked", self.cancels_leaked),
            ("superseded", self.superseded),
        ):
            if items:
                parts.append(f"{len(items)} {kind}, e.g.:\n  " + "\n  ".join(items[:5]))
        twice = [s for s in self.sources if len(s.deliveries) + len(s.dead) > 1]
        if twice:
            parts.append(
                f"{len(twice)} delivered more than once, e.g.:\n  "
                + "\n  ".join(
                    f"{s.where()} ts {s.rec.ts} -> "
                    + ", ".join(
                        f"{d.topic}[{d.partition}]@{d.offset} ts {d.ts}"
                        for d in s.deliveries + s.dead
                    )
                    + "".join(
                        f"; copy {c.topic}[{c.partition}]@{c.offset} ts {c.ts}"
                        f" moved by {_text(c.header(_MOVED_BY))}"
                        for c in s.copies
                    )
                    for s in twice[:5]
                )
            )
        if parts and self.logs:
            parts.append("daemon logs: " + " ".join(self.logs))
        return "\n".join(parts)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def dead_letter_origin(rec: Rec) -> tuple[str, int, int] | None:
    """(topic, partition, offset) of the record a dead letter carries, from its headers."""
    topic = _text(rec.header("dlq-origin-topic"))
    partition = _number(rec.header("dlq-origin-partition"))
    offset = _number(rec.header("dlq-origin-offset"))
    if topic is None or partition is None or offset is None:
        return None
    return topic, partition, offset


def evaluate(
    scenario: str,
    reader: Reader,
    topology: Topology,
    sent: dict[tuple[str, int, int], Produced],
    may_dead_letter: Callable[[Source], bool] | None = None,
) -> Report:
    """Match every source to its deliveries and dead letters and judge each copy.

    `may_dead_letter` marks sources whose dead-lettering is acceptable although their
    envelope is valid (a target deleted mid-run).
    """
    by_id: dict[str, list[Rec]] = defaultdict(list)
    copies_by_id: dict[str, list[Rec]] = defaultdict(list)
    dead_by_origin: dict[tuple[str, int, int], list[Rec]] = defaultdict(list)
    sources: list[Source] = []
    wrong: list[str] = []
    dead_reasons: Counter[str] = Counter()
    moves = _moves([r for t in topology.precise for r in reader.records.get(t, [])])
    level_marks = _level_markers(reader.records.get(topology.markers or "", []))
    for topic, records in reader.records.items():
        if topic == topology.markers:
            continue
        for rec in records:
            position = (rec.topic, rec.partition, rec.offset)
            if topic in topology.precise and (rec.has("delay-cancel") or rec.has(_RESCHEDULE)):
                continue  # a marker: the cancel tests judge those, reschedules move dues
            if topic in topology.levels and rec.has(_MOVED_BY):
                # A moved message's copy: the same message, judged by its source.
                copies_by_id[_text(rec.header("delay-id")) or ""].append(rec)
                continue
            if topic in topology.levels or topic in topology.precise:
                produced = sent.get(position)
                exp = expect(rec, topology)
                due = None
                if exp.kind != "dead":
                    due = rec.ts + max(topology.levels.get(topic, 0), exp.delay_ms)
                    if topic in topology.precise and exp.due_ms is not None:
                        due = max(due, exp.due_ms)  # an absolute due time is a floor
                # Not ours and no envelope: the daemon forwarded into a level topic (a
                # hostile target). That is a delivery, and a new source to dead-letter.
                echo = produced is None and not rec.has("delay-v")
                sources.append(Source(rec, produced, exp, due, echo=echo))
                if not echo:
                    continue
            if topic == topology.dead_letter_topic and rec.has("dlq-reason"):
                origin = dead_letter_origin(rec)
                reason = _text(rec.header("dlq-reason")) or ""
                dead_reasons[reason] += 1
                if origin is None or not reason:
                    wrong.append(f"dead letter {position} has no reason or origin")
                else:
                    dead_by_origin[origin].append(rec)
                continue
            message_id = _text(rec.header("delay-id"))
            if message_id is None:
                wrong.append(f"stray record without delay-id on {position}")
            else:
                by_id[message_id].append(rec)
    positions = set()
    for source in sources:
        position = (source.rec.topic, source.rec.partition, source.rec.offset)
        positions.add(position)
        if not source.echo and source.expect.id is not None:
            source.deliveries = by_id.get(source.expect.id, [])
            source.copies = copies_by_id.get(source.expect.id, [])
            home = (source.rec.topic, source.rec.partition, source.expect.id)
            _apply_moves(source, moves.get(home, []))
            if source.rec.topic in topology.levels:
                marks = level_marks.get(source.expect.id, [])
                _apply_level_markers(source, marks, topology.cancel_lead_ms)
        source.dead = dead_by_origin.get(position, [])
        wrong.extend(_judge(source, may_dead_letter))
    for origin, letters in dead_by_origin.items():
        if origin not in positions:
            wrong.append(f"{len(letters)} dead letters point at no record: {origin}")
    missing = [f"{p} acknowledged but not on the level topic" for p in sent if p not in positions]
    wrong.extend(
        f"{r.topic}[{r.partition}]@{r.offset} is not LogAppendTime"
        for records in reader.records.values()
        for r in records[:1]
        if r.ts_type != LOG_APPEND_TIME and r.topic != topology.dead_letter_topic
    )
    return Report(
        scenario,
        [s for s in sources if not s.cancelled and not s.raced],
        missing,
        wrong,
        dead_reasons,
        cancelled=[s for s in sources if s.cancelled],
        raced=[s for s in sources if s.raced],
    )


_RESCHEDULE = "delay-reschedule"
_MOVED_BY = "delay-moved-by"


def _level_markers(records: list[Rec]) -> dict[str, list[tuple[int, int, str, int | None]]]:
    """Level markers by id: (append time, offset, kind, time asked for a reschedule)."""
    out: dict[str, list[tuple[int, int, str, int | None]]] = defaultdict(list)
    seen: set[tuple[int, int]] = set()
    for rec in records:
        if (rec.partition, rec.offset) in seen:
            continue  # one marker, read twice (a reader rebuilt mid-run): it acts once
        seen.add((rec.partition, rec.offset))
        cancelled = _text(rec.header("delay-cancel"))
        if cancelled is not None:
            out[cancelled].append((rec.ts, rec.offset, "cancel", None))
            continue
        moved = _text(rec.header(_RESCHEDULE))
        if moved is None:
            continue
        delay_ms = _number(rec.header("delay-ms")) or 0
        asked = max(rec.ts + delay_ms, _number(rec.header("delay-due-ms")) or 0)
        out[moved].append((rec.ts, rec.offset, "reschedule", asked))
    return out


def _apply_level_markers(
    source: Source, marks: list[tuple[int, int, str, int | None]], lead_ms: int = 0
) -> None:
    """Each marker appended at least `lead_ms` before the due time then in force acts, in
    append order: a cancel for good, a reschedule moves the due time (a past time
    meaning at once). One appended within the lead acts only if the daemon read it
    before the forward (`cancel_lead`): the source raced, and either outcome stands."""
    replaced = list(source.replaced)
    for appended, _, kind, asked in sorted(marks):
        if source.due_ms is None or appended >= source.due_ms:
            continue
        if appended >= source.due_ms - lead_ms:
            source.raced = True
            break
        if kind == "cancel":
            source.cancelled = True
            break
        replaced.append(source.due_ms)
        source.due_ms = max(asked or 0, appended)
        source.level_moved = True
    source.replaced = tuple(replaced)


def _moves(markers: list[Rec]) -> dict[tuple[str, int, str], list[tuple[int, int, int]]]:
    """Reschedule markers by (topic, partition, id): (offset, append time, asked due)."""
    out: dict[tuple[str, int, str], list[tuple[int, int, int]]] = defaultdict(list)
    for rec in markers:
        message_id = _text(rec.header(_RESCHEDULE))
        if message_id is None:
            continue
        delay_ms = _number(rec.header("delay-ms")) or 0
        asked = max(rec.ts + delay_ms, _number(rec.header("delay-due-ms")) or 0)
        out[(rec.topic, rec.partition, message_id)].append((rec.offset, rec.ts, asked))
    return out


def _apply_moves(source: Source, moves: list[tuple[int, int, int]]) -> None:
    """The markers after the message, in order, each read before the due time it
    replaces (a marker after that is too late and changes nothing)."""
    replaced: list[int] = []
    for offset, appended, asked in sorted(moves):
        if source.due_ms is None or offset < source.rec.offset or appended >= source.due_ms:
            continue
        replaced.append(source.due_ms)
        source.due_ms = asked
    source.replaced = tuple(replaced)


def _judge(source: Source, may_dead_letter: Callable[[Source], bool] | None) -> list[str]:
    """Everything wrong with the copies of one source (loss and lateness are counted
    elsewhere)."""
    out = []
    exp, rec = source.expect, source.rec
    for d in source.deliveries:
        if exp.kind == "dead":
            out.append(f"{source.where()} was forwarded to {d.topic}")
            continue
        problems = []
        if d.topic != exp.target:
            problems.append(f"topic {d.topic}")
        if exp.partition is not None and d.partition != exp.partition:
            problems.append(f"partition {d.partition} instead of {exp.partition}")
        if (d.key, d.value) != (rec.key, rec.value):
            problems.append("key or value changed")
        if user_headers(d.headers) != user_headers(rec.headers):
            problems.append("user headers changed")
        delivered_due = _number(d.header("delay-due-ms"))
        # A delay-ms above its level is re-published to a longer level and delivered at
        # that level's due time: later than asked (never earlier), and it says so.
        rerouted = (
            source.due_ms is not None
            and (source.due_ms - rec.ts == exp.delay_ms or source.level_moved)
            and delivered_due is not None
            and delivered_due >= source.due_ms
        )
        # A raced marker may or may not have moved it: either due time stands.
        if delivered_due != source.due_ms and not rerouted and not source.raced:
            problems.append(f"delay-due-ms {d.header('delay-due-ms')!r} != {source.due_ms}")
        if problems:
            out.append(f"{source.where()} forwarded wrongly: {', '.join(problems)}")
    for letter in source.dead:
        if letter.header("dlq-stub") == b"1":
            # A payload-free stub is the documented fallback for a copy too large for
            # the dead-letter topic, and only for that.
            if _size(rec) < LARGE_BYTES:
                out.append(f"{source.where()}: a {_size(rec)}-byte record was stubbed")
        elif (letter.key, letter.value) != (rec.key, rec.value):
            out.append(f"{source.where()}: dead letter's key or value differs")
    if (
        exp.kind == "forward"
        and source.dead
        and not source.deliveries
        and not (may_dead_letter and may_dead_letter(source))
    ):
        reason = source.dead[0].header("dlq-reason")
        detail = (source.dead[0].header("dlq-detail") or b"")[:120]
        out.append(f"{source.where()} was dead-lettered: {reason!r} {detail!r}")
    return out


def recovery_s(
    report: Report,
    fault_ends_ms: list[int],
    group: Callable[[Source], Any] = lambda s: (s.rec.topic, s.rec.partition),
) -> list[float | None]:
    """Per fault: seconds from the end of the fault until every group (by default every
    level-topic partition) that forwarded anything afterwards has forwarded its first
    record after it. Forwarding is measured by target append time."""
    firsts: dict[Any, list[int]] = defaultdict(list)
    for s in report.sources:
        if s.produced is not None:
            firsts[group(s)].extend(d.ts for d in s.deliveries)
    for times in firsts.values():
        times.sort()
    out: list[float | None] = []
    for end in fault_ends_ms:
        waits = [
            next(t for t in times if t >= end) - end
            for times in firsts.values()
            if times and times[-1] >= end
        ]
        out.append(max(waits) / 1000 if waits else None)
    return out
