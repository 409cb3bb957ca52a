"""How far, in time, the intake has read its partitions, and so what the wheel may hand
the forwarders.

A precise cancel is a record in its message's own partition; once the intake has read
it, the message is dropped when taken. After a start nothing goes out until the intake
has read what its partitions held (`Intake.caught_up`). A daemon frozen (SIGSTOP, a VM
paused), starved, or cut off from the broker past due times has no such point: thawed,
its forwarder finds the overdue records at once while the cancels acknowledged
meanwhile still wait unread, and they lost that race every time in the fault suite's
scenario 30 before this gate.

So the intake, over and over, notes the time, asks the broker where each partition it
reads ends (the last stable offset, as its read_committed reading sees it), and once it
has read up to those ends, every record appended before the time noted has been read:
`through_s`. The wheel hands out a record only once `through_s` is within `lead_s` of
its fire time. The intake keeps within a fraction of a second in operation, so nothing
waits; after a stall, what fell due meanwhile waits for one round. The lead is what the
promise gives up for that: a cancel the broker acknowledged at least `lead_s` before
its message's due time is honoured whatever the daemon was doing; one acknowledged
closer to it, when the intake read it first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import Any, Final

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from delayservice.clock import Clock
from delayservice.kafka.client_errors import raised_by
from delayservice.log_throttle import Throttle

log = logging.getLogger(__name__)

LEAD_S: Final = 1.0
"""How long before its due time a cancel must be acknowledged to be honoured whatever
the daemon was doing: `Settings.cancel_lead`, whose default this is. Above the intake's
idle poll (0.2 s) plus a round of asking, with room for a loaded host."""
ASK_EVERY_S: Final = 0.05
"""At most one round per this long: a round is a request per end, kept small."""
ASK_TIMEOUT_S: Final = 10.0
QUIET_FAILURES_S: Final = 30.0
"""Rounds failing for less than this are logged at INFO: a topic just made, a leader
moving, a broker restarting (the intake says so itself)."""
TICK_S: Final = 0.001
"""Append times are whole milliseconds: a marker stamped with the instant a round began
may have come just after the round asked where its partition ends, so a round vouches
only for the instants before it began. A marker stamped exactly `lead_s` before its
message's due time is then read before the message goes, as the promise says."""
UNREAD: Final = float("-inf")
"""`through_s` before the first round: nothing goes out."""

Moved = Callable[[float, float], None]


class ReadThrough:
    """`limit_s`: the latest fire time (clock seconds) that may go out now. Written by
    the intake thread, read by the forwarders' (a float, read whole)."""

    def __init__(self, lead_s: float = LEAD_S) -> None:
        self.lead_s = lead_s
        self.through_s = UNREAD
        """Every record appended before this (clock seconds) has been read."""
        self._moved: list[Moved] = []

    def limit_s(self) -> float:
        return self._limit_s(self.through_s)

    def _limit_s(self, through_s: float) -> float:
        return through_s + self.lead_s - TICK_S

    def on_move(self, moved: Moved) -> None:
        """`moved(old_limit_s, new_limit_s)` after each move, on the intake thread."""
        self._moved.append(moved)

    def advance(self, began_s: float) -> None:
        """A round that began at `began_s` has been read through."""
        old = self.through_s
        if began_s <= old:
            return
        self.through_s = began_s
        for moved in self._moved:
            moved(self._limit_s(old), self._limit_s(began_s))

    def lag_s(self, now_s: float) -> float:
        """How far behind `now_s` the reading is known complete (inf before a round)."""
        return max(0.0, now_s - self.through_s)


def _spec(name: str) -> Any:
    """`OffsetSpec.earliest()` or `.latest()` (confluent-kafka leaves them untyped)."""
    return getattr(OffsetSpec, name)()


class _Round:
    """One round: asked at `began_s` for the ends of `partitions`."""

    __slots__ = ("began_s", "ends", "futures", "partitions")

    def __init__(self, began_s: float, partitions: frozenset[int], futures: dict[Any, Any]) -> None:
        self.began_s = began_s
        self.partitions = partitions
        self.futures = futures
        self.ends: dict[int, tuple[int, int]] | None = None
        """partition -> (first offset, end), once every answer is in."""


class ReadThroughRounds:
    """The intake's side: asks the ends through an admin client (its answers come on
    librdkafka's thread, so the intake never waits for them) and moves `gate` when the
    intake's positions reach them. One round at a time."""

    def __init__(
        self,
        topic: str,
        make_admin: Callable[[], Any],
        gate: ReadThrough,
        clock: Clock,
    ) -> None:
        self.topic = topic
        self.gate = gate
        self._make_admin = make_admin
        self._admin: Any = None
        self._clock = clock
        self._round: _Round | None = None
        self._next_ask = 0.0
        self._throttle = Throttle()
        self._failing_since: float | None = None
        self._known: frozenset[int] = frozenset()
        """Partitions the admin client's metadata holds: one it lacks (the topic grew)
        fails every round with _UNKNOWN_PARTITION until its metadata is read again,
        which librdkafka does on its own only every 5 minutes."""

    @property
    def asked_ends(self) -> dict[int, tuple[int, int]] | None:
        """The round in hand's answers, partition -> (first offset, end), once all in."""
        return None if self._round is None else self._round.ends

    def step(
        self, reading: Collection[int], read_to: Callable[[list[int]], dict[int, int]]
    ) -> None:
        """Called by the intake after each batch is handled: `reading`, the partitions it
        reads; `read_to`, per partition, the offset it has read (and handled) up to, -1
        when unknown. Never raises: a failed round is asked again."""
        exc = raised_by(lambda: self._step(frozenset(reading), read_to))
        if exc is not None:  # a broker away, a client refusing: the gate just waits
            self._round = None
            self._known = frozenset()  # read the metadata again before the next round
            now = time.monotonic()
            if self._failing_since is None:
                self._failing_since = now
            if self._throttle.allow(type(exc).__name__) is not None:
                lasting = now - self._failing_since >= QUIET_FAILURES_S
                log.log(
                    logging.WARNING if lasting else logging.INFO,
                    "%s: asking where its partitions end: %s; asking again",
                    self.topic,
                    exc,
                )

    def _step(
        self, reading: frozenset[int], read_to: Callable[[list[int]], dict[int, int]]
    ) -> None:
        current = self._round
        if current is not None and current.partitions != reading:
            current = self._round = None  # partitions gained or lost: ask about them all
        if current is None:
            if reading and self._clock() >= self._next_ask:
                self._round = self._ask(reading)
            return
        if current.ends is None and not self._answered(current):
            return
        ends = current.ends
        assert ends is not None
        positions = read_to(sorted(ends))
        self._failing_since = None
        if all(end <= max(positions.get(p, -1), first) for p, (first, end) in ends.items()):
            self._round = None
            self.gate.advance(current.began_s)

    def _ask(self, partitions: frozenset[int]) -> _Round:
        if self._admin is None:
            self._admin = self._make_admin()
        if not partitions <= self._known:
            topic = self._admin.list_topics(self.topic, timeout=ASK_TIMEOUT_S).topics.get(
                self.topic
            )
            self._known = frozenset(topic.partitions) if topic is not None else frozenset()
        began = self._clock()
        self._next_ask = began + ASK_EVERY_S
        futures: dict[Any, Any] = {}
        specs = ((_spec("earliest"), "first"), (_spec("latest"), "end"))
        for spec, kind in specs:
            asked = self._admin.list_offsets(
                {TopicPartition(self.topic, p): spec for p in partitions},
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=ASK_TIMEOUT_S,
            )
            futures.update({(kind, tp.partition): future for tp, future in asked.items()})
        return _Round(began, partitions, futures)

    def _answered(self, current: _Round) -> bool:
        """Collect the answers once all are in; a failed one raises (`step` asks again)."""
        if not all(future.done() for future in current.futures.values()):
            return False
        found: dict[tuple[str, int], int] = {}
        for key, future in current.futures.items():
            offset = future.result().offset  # raises KafkaException on an error
            if offset < 0:
                raise KafkaException(f"no offset for {self.topic}[{key[1]}]")
            found[key] = offset
        current.ends = {p: (found[("first", p)], found[("end", p)]) for p in current.partitions}
        return True
