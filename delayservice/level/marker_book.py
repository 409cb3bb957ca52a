"""Every level marker that can still matter, in one process's memory.

The reader (`marker_reader`) files each marker here by the id it names, and each answer
it reads back from the outcomes topic: which markers were answered, and which
reschedules were carried out (their copy exists). The forwarders ask it about the ids
they hold (`verdict_for`), note what they decided (answers given, moves carried out,
messages delivered or cancelled for good) and take it back when their transaction did
not commit. Only the partitions a marker's id names are screened (`watch`), so a
partition with no marker pending costs the forwarding nothing.

A marker is kept until no record still waiting can need it: its append time is before
the gate's oldest need, and before now less twice the top level's delay (a moved
message waits at most that long after its first due time). How many are kept is a
gauge, bounded by the markers sent within that window.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Final

from delayservice.forward.buffer import TP
from delayservice.level.marker_verdict import LevelMarker, Verdict, verdict
from delayservice.levels import LevelSet
from delayservice.markers.level_ids import level_place
from delayservice.markers.replies import CANCEL, CANCELLED, RESCHEDULE, MarkerReply

REFUSED: Final = "refused"
UNMATCHED: Final = "unmatched"
FORWARDED: Final = "forwarded"


@dataclass(slots=True)
class Entry:
    """A marker and who answers it: the owner of `tp` (the partition its id names, or
    for a marker that names none, of the first level's partition 0)."""

    marker: LevelMarker
    tp: TP
    refusal: tuple[str, str] | None = None
    """(outcome, reason) decided on reading: a marker that asks nothing a daemon can do."""
    sent_ms: int | None = None
    """When the id says its message was sent (the producer's clock)."""
    delay_ms: int = 0
    """The delay of the level the id names."""


@dataclass
class Action:
    """What one forwarder decided about markers in its open interval; confirmed when
    the interval commits, taken back when it does not."""

    answers: list[tuple[bytes, str]] = field(default_factory=list)
    executed: list[bytes] = field(default_factory=list)
    final: list[tuple[str, str]] = field(default_factory=list)
    copies: list[tuple[str, TP]] = field(default_factory=list)


class MarkerBook:
    def __init__(self, levels: LevelSet) -> None:
        self._levels = levels
        self.answers_tp: TP = (levels.levels[0].topic, 0)
        self._lock = threading.RLock()
        self.by_id: dict[str, list[Entry]] = {}
        self.keys: dict[bytes, Entry] = {}
        self.watch: dict[TP, set[bytes]] = {}
        """Partition -> the ids (as the records carry them) with a marker pending."""
        self.unresolved: dict[TP, dict[bytes, Entry]] = {}
        """Partition -> its markers not answered yet, for its owner to settle."""
        self.answered: dict[bytes, str] = {}
        self._orphans: dict[bytes, int] = {}
        """Answers read before their marker (or for one not kept): key -> when written."""
        self.executed: set[bytes] = set()
        self.copies: dict[str, TP] = {}
        """Id -> where its latest copy was written, per the answer of the move."""
        self._copies_by_tp: dict[TP, set[str]] = {}
        self.final: dict[str, str] = {}
        self.partitions: dict[str, int] = {}
        """Level topic -> its partition count, as the reader last saw it."""
        self.version = 0
        """Counts markers and answers filed (an owner may have work when it moves)."""

    # -- filing (the reader) -------------------------------------------------------
    def file(self, marker: LevelMarker, refusal: tuple[str, str] | None = None) -> Entry | None:
        """Keep a marker read from the markers topic (again after a rewind: kept once).
        Returns its entry when it is new."""
        with self._lock:
            if marker.key in self.keys:
                return None
            self._orphans.pop(marker.key, None)
            entry = self._entry(marker, refusal)
            self.keys[marker.key] = entry
            if entry.refusal is None:
                self.by_id.setdefault(marker.message_id, []).append(entry)
                self.watch.setdefault(entry.tp, set()).add(marker.message_id.encode())
            if marker.key not in self.answered:
                self.unresolved.setdefault(entry.tp, {})[marker.key] = entry
            self.touch()
            return entry

    def _entry(self, marker: LevelMarker, refusal: tuple[str, str] | None) -> Entry:
        if refusal is not None:
            return Entry(marker, self.answers_tp, refusal)
        place = level_place(marker.message_id)
        if place is None:
            reason = (
                "this id names no level and partition (an id from before ids named them, "
                "or not a level message's): its message cannot be found; level messages "
                "sent now have ids ending in -l<level>p<partition>"
            )
            return Entry(marker, self.answers_tp, (UNMATCHED, reason))
        levels = self._levels.levels
        if place.level > len(levels):
            return Entry(marker, self.answers_tp, (REFUSED, f"no level {place.level} here"))
        level = levels[place.level - 1]
        count = self.partitions.get(level.topic)
        if count is not None and place.partition >= count:
            reason = f"{level.topic} has no partition {place.partition} (it has {count})"
            return Entry(marker, self.answers_tp, (REFUSED, reason))
        tp = (level.topic, place.partition)
        if (
            marker.asked_due_ms is not None
            and marker.asked_due_ms - marker.appended_ms > self._levels.max_delay_ms
        ):
            ahead_s = (marker.asked_due_ms - marker.appended_ms) / 1000
            reason = f"the new time is {ahead_s:g} s ahead, beyond the top level ({self._top()})"
            return Entry(marker, tp, (REFUSED, reason), place.sent_ms, level.delay_ms)
        return Entry(marker, tp, None, place.sent_ms, level.delay_ms)

    def _top(self) -> str:
        return self._levels.levels[-1].name

    def answer_read(self, key: bytes, reply: MarkerReply, written_ms: int) -> None:
        """An answer read back from the outcomes topic (committed): never answered again,
        and a move in it was carried out. One that does not fit its marker (anyone who
        may write the topic could write it) changes nothing."""
        with self._lock:
            entry = self.keys.get(key)
            if entry is None:
                self._orphans[key] = written_ms
            elif entry.marker.message_id != reply.message_id or entry.marker.kind != reply.kind:
                return
            else:
                self.unresolved.get(entry.tp, {}).pop(key, None)
            self.answered[key] = reply.outcome
            if reply.kind == RESCHEDULE and reply.outcome == "moved" and reply.copy is not None:
                self.executed.add(key)
                topic, _, partition = reply.copy.rpartition(":")
                if partition.isdigit():
                    self._copy(reply.message_id, (topic, int(partition)))
            elif reply.kind == CANCEL and reply.outcome == CANCELLED:
                self.final[reply.message_id] = CANCELLED
            self.touch()

    def touch(self) -> None:
        self.version += 1

    # -- asking (the forwarders) -----------------------------------------------------
    def has(self, message_id: str) -> bool:
        return message_id in self.by_id

    def has_reschedule(self, message_id: str) -> bool:
        return any(e.marker.kind == RESCHEDULE for e in self.by_id.get(message_id, ()))

    def copies_on(self, tp: TP) -> set[str]:
        """Ids whose latest copy was written to `tp` (its owner answers their markers)."""
        with self._lock:
            return set(self._copies_by_tp.get(tp, ()))

    def _copy(self, message_id: str, where: TP | None) -> None:
        """Note where an id's latest copy is (None: nowhere known)."""
        old = self.copies.pop(message_id, None)
        if old is not None:
            ids = self._copies_by_tp.get(old)
            if ids is not None:
                ids.discard(message_id)
                if not ids:
                    del self._copies_by_tp[old]
        if where is not None:
            self.copies[message_id] = where
            self._copies_by_tp.setdefault(where, set()).add(message_id)

    def verdict_for(
        self, message_id: str, after: tuple[int, int, int] | None, due_ms: int
    ) -> Verdict:
        with self._lock:
            markers = [e.marker for e in self.by_id.get(message_id, ())]
            return verdict(markers, after, due_ms, self.executed)

    def entries(self, tp: TP) -> list[Entry]:
        """The markers the owner of `tp` has yet to answer."""
        with self._lock:
            return list(self.unresolved.get(tp, {}).values())

    def is_answered(self, key: bytes) -> bool:
        return key in self.answered

    # -- what a forwarder decided ----------------------------------------------------
    def apply(self, action: Action) -> None:
        """Note an interval's decisions at once (they count while it is open)."""
        with self._lock:
            for key, outcome in action.answers:
                self.answered[key] = outcome
                entry = self.keys.get(key)
                if entry is not None:
                    self.unresolved.get(entry.tp, {}).pop(key, None)
            self.executed.update(action.executed)
            for message_id, state in action.final:
                self.final[message_id] = state
            for message_id, where in action.copies:
                self._copy(message_id, where)

    def take_back(self, action: Action) -> None:
        """The interval did not commit: its decisions are made again."""
        with self._lock:
            for key, _ in action.answers:
                self.answered.pop(key, None)
                entry = self.keys.get(key)
                if entry is not None:
                    self.unresolved.setdefault(entry.tp, {})[key] = entry
            self.executed.difference_update(action.executed)
            for message_id, _ in action.final:
                self.final.pop(message_id, None)
            for message_id, where in action.copies:
                if self.copies.get(message_id) == where:
                    self._copy(message_id, None)
            self.touch()

    # -- forgetting ------------------------------------------------------------------
    def expire(self, before_ms: int) -> int:
        """Forget the markers appended before `before_ms`; returns how many went."""
        with self._lock:
            gone = [key for key, e in self.keys.items() if e.marker.appended_ms < before_ms]
            for key in gone:
                self._forget(self.keys.pop(key))
            orphans = [key for key, ms in self._orphans.items() if ms < before_ms]
            for key in orphans:
                del self._orphans[key]
                self.answered.pop(key, None)
                self.executed.discard(key)
            return len(gone)

    def _forget(self, entry: Entry) -> None:
        key, message_id = entry.marker.key, entry.marker.message_id
        self.answered.pop(key, None)
        self.executed.discard(key)
        self.unresolved.get(entry.tp, {}).pop(key, None)
        if entry.refusal is not None:
            return
        left = [e for e in self.by_id.get(message_id, ()) if e is not entry]
        if left:
            self.by_id[message_id] = left
            return
        self.by_id.pop(message_id, None)
        self._copy(message_id, None)
        self.final.pop(message_id, None)
        ids = self.watch.get(entry.tp)
        if ids is not None:
            ids.discard(message_id.encode())
            if not ids:
                del self.watch[entry.tp]

    def kept(self) -> dict[str, int]:
        """How many markers are kept, by kind."""
        with self._lock:
            out: dict[str, int] = {}
            for entry in self.keys.values():
                out[entry.marker.kind] = out.get(entry.marker.kind, 0) + 1
            return out

    def partition_count(self, topic: str, count: int) -> None:
        self.partitions[topic] = count
