"""Every level marker that can still matter, in one process's memory, within a share of
its memory budget.

The reader (`reader`) files each marker here by the id it names, and each answer
it reads back from the outcomes topic: which markers were answered, and which
reschedules were carried out (their copy exists). The forwarders ask it about the ids
they hold (`verdict_for`), note what they decided (answers given, moves carried out,
messages delivered or cancelled for good) and take it back when their transaction did
not commit. Only the partitions a marker's id names are screened (`watch`), so a
partition with no marker pending costs the forwarding nothing.

A marker is kept until no record still waiting can need it: its append time is before
the gate's oldest need, and before now less twice the top level's delay (a moved
message waits at most that long after its first due time). Markers are kept compactly
(`store`: about 90 bytes each, measured by `benchmarks/marker_book_memory.py`)
and counted in the process's memory budget (`total_bytes`). When the book reaches its
share (`max_bytes`) it first lets go of the markers whose committed answer leaves
nothing to decide (`shed`: unmatched, too late, refused); if it is still full, the
reader stops reading markers (`full`), so the gate stays where it was and level records
due since wait: late, never a cancel forgotten.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Final

from delayservice.forward.buffer import TP
from delayservice.level.markers import store as st
from delayservice.level.markers.answers import FORWARDED, Action, Answers
from delayservice.level.markers.copies import Copies
from delayservice.level.markers.entry import Entry
from delayservice.level.markers.orphans import OrphanAnswers
from delayservice.level.markers.placing import REFUSED, UNMATCHED, Placing
from delayservice.level.markers.slots import Slots
from delayservice.level.markers.verdict import TOO_LATE, LevelMarker, Verdict, verdict
from delayservice.level.markers.views import Executed, FinalStates, Keys, Watch
from delayservice.levels import LevelSet
from delayservice.markers.replies import RESCHEDULE, MarkerReply

__all__ = ["FILE_SLICE", "FORWARDED", "REFUSED", "UNMATCHED", "Action", "MarkerBook"]

SHEDDABLE: Final = frozenset({REFUSED, UNMATCHED, TOO_LATE})
"""Committed answers after which a marker decides nothing: no message, or sent already."""
LOOSE_BYTES: Final = 200
"""What the book counts for each thing kept in a dictionary (orphan answers, copies)."""
RESUME_RATIO: Final = 0.9
"""A full book takes markers again once below this share of `max_bytes`."""


FILE_SLICE: Final = 64
"""Markers filed per hold of the lock (`file_run`): about a millisecond of a
forwarder's wait."""


class MarkerBook:
    def __init__(self, levels: LevelSet, max_bytes: int | None = None) -> None:
        """`max_bytes`: the book's share of the memory budget (None: no bound)."""
        self.max_bytes = max_bytes
        self._placing = Placing(levels)
        self.answers_tp = self._placing.answers_tp
        self.partitions = self._placing.partitions
        """Level topic -> its partition count, as the reader last saw it (`Placing`)."""
        self._lock = threading.RLock()
        self._sources: dict[tuple[str, int], int] = {}
        self._source_names: list[tuple[str, int]] = []
        self._tps: dict[TP, int] = {}
        self._tp_names: list[TP] = []
        self._refusals: dict[tuple[str, str], int] = {}
        self._refusal_names: list[tuple[str, str]] = []
        self._orphans = OrphanAnswers()
        self._copies = Copies()
        self.copies = self._copies.latest
        """Id -> where its latest copy was written, per the answer of the move."""
        slots = Slots(st.Columns(), self._sources, self._source_names, self._orphans, self._copies)
        self._answers = Answers(slots, self._orphans, self._copies)
        """What the markers were answered, and what follows (their moves, final states)."""
        self._use(slots)
        self.version = 0
        """Counts markers and answers filed (an owner may have work when it moves)."""
        self.total_bytes = 0
        """What the book holds, as the memory budget counts it (`measure`)."""
        self.total_buffered = 0
        """No held records: the budget's `Holdings` protocol."""
        self.shed_count = 0
        self.watch = Watch(self)
        """Level partition -> what screens its records: `watch.get(tp)`."""
        self.keys = Keys(self)
        self.executed = Executed(self)
        self.final = FinalStates(self)

    def _use(self, slots: Slots) -> None:
        """Keep the markers in `slots` from now on (`_cols`, `_ids`, `_chain`: theirs, at
        hand)."""
        self._slots = slots
        self._cols = slots.cols
        self._ids = slots.ids
        self._chain = slots.chain
        self._answers.slots = slots

    def _entry_of(self, slot: int) -> Entry:
        cols = self._cols
        i = slot - cols.base
        marker = self._slots.marker(slot)
        tp = self._tp_names[cols.tp[i]]
        code = cols.refusal[i]
        refusal = None if code < 0 else self._refusal_names[code]
        if not cols.flags[i] & st.PLACED:
            return Entry(marker, tp, refusal, slot=slot)
        sent: int | None = None
        if cols.flags[i] & st.PACKED:  # the send time is the id's first 12 hex digits
            sent = int.from_bytes(self._cols.raw_id(slot)[:6], "big")
        return self._placing.placed(marker, tp, refusal, slot, sent)

    # -- filing (the reader) -------------------------------------------------------
    def file(self, marker: LevelMarker, refusal: tuple[str, str] | None = None) -> Entry | None:
        """Keep a marker read from the markers topic (again after a rewind: kept once).
        Returns its entry when it is new."""
        with self._lock:
            entry = self._file_one(marker, refusal)
            if entry is not None:
                self.version += 1
            return entry

    def file_run(
        self, read: list[tuple[LevelMarker, tuple[str, str] | None]]
    ) -> list[tuple[LevelMarker, Exception]]:
        """`file` each of a run of markers read, under the lock a slice at a time: a
        flood is filed at a lock and a version step per slice, not per marker, and the
        forwarders are kept out no longer than a slice takes. Returns the markers that
        could not be filed, each with why (the others are kept all the same)."""
        failed: list[tuple[LevelMarker, Exception]] = []
        for start in range(0, len(read), FILE_SLICE):
            with self._lock:
                filed = False
                for marker, refusal in read[start : start + FILE_SLICE]:
                    try:
                        filed = self._file_one(marker, refusal) is not None or filed
                    except Exception as exc:  # one marker never costs the others
                        failed.append((marker, exc))
                if filed:  # a slice read again, all kept before, asks the owners nothing
                    self.version += 1
        return failed

    def _file_one(self, marker: LevelMarker, refusal: tuple[str, str] | None) -> Entry | None:
        slots = self._slots
        if slots.find(marker.topic, marker.partition, marker.offset) >= 0:
            return None
        entry = self._placing.entry(marker, refusal)
        raw, packed = st.pack_id(marker.message_id, entry.sent_ms is not None)
        flags = st.LIVE | (st.PACKED if packed else 0)
        if marker.kind == RESCHEDULE:
            flags |= st.RESCHEDULE_KIND
        if entry.sent_ms is not None:
            flags |= st.PLACED
        source = st.code(self._sources, self._source_names, (marker.topic, marker.partition))
        if source == len(slots.by_source):
            slots.by_source.append(st.Source())
        tp = st.code(self._tps, self._tp_names, entry.tp)
        code = -1 if entry.refusal is None else self._refusal_code(entry.refusal)
        answer = flags_read = 0
        orphans = self._orphans
        if orphans.written or orphans.answers or orphans.executed:
            outcome, flags_read = orphans.take(marker.key, marker.message_id, marker.kind)
            answer = 0 if outcome is None else self._answers.outcome(outcome)
        row = (marker.appended_ms, marker.offset, source, tp, code, flags | flags_read, raw)
        slots.add(row, answer, marker.asked_due_ms, marker.message_id)
        self.total_bytes += 80 + len(raw)
        return entry

    def _compact(self) -> None:
        self._use(self._slots.compacted())

    def _refusal_code(self, refusal: tuple[str, str]) -> int:
        if refusal not in self._refusals and len(self._refusal_names) >= 30_000:
            refusal = (refusal[0], "refused (one of too many distinct reasons to keep)")
        return st.code(self._refusals, self._refusal_names, refusal)

    def answer_read(self, key: bytes, reply: MarkerReply, written_ms: int) -> None:
        """An answer read back from the outcomes topic (committed): never answered again,
        and a move in it was carried out. One that does not fit its marker (anyone who
        may write the topic could write it) changes nothing."""
        with self._lock:
            if self._answers.read(key, reply, written_ms):
                self.touch()

    def final_of(self, message_id: str) -> str | None:
        with self._lock:
            return self._answers.final_of(message_id)

    def touch(self) -> None:
        with self._lock:  # the consumer thread touches too, beside the reader
            self.version += 1

    # -- asking (the forwarders) -----------------------------------------------------
    def has(self, message_id: str) -> bool:
        with self._lock:
            return self._slots.head(message_id) >= 0

    def has_reschedule(self, message_id: str) -> bool:
        with self._lock:
            slots = self._slots
            flags = slots.flags
            return any(flags(s) & st.RESCHEDULE_KIND for s in self._chain(slots.head(message_id)))

    def names(self, raw_id: bytes, tp: TP) -> bool:
        """Whether a marker kept names the message `raw_id` (as a record carries it) on
        `tp` (the forwarders' screen)."""
        with self._lock:
            t = self._tps.get(tp)
            cols = self._cols
            return any(cols.tp[s - cols.base] == t for s in self._chain(self._ids.head(raw_id)))

    def named(self, tp: TP, raw_ids: list[bytes]) -> list[int]:
        """Positions of `raw_ids` (a run's ids, as records carry them) that a marker kept
        names on `tp`: one probe each, ids compared only where hash bits match."""
        with self._lock:
            return [pos for pos in self._ids.maybe(raw_ids) if self.names(raw_ids[pos], tp)]

    def copies_on(self, tp: TP) -> set[str]:
        """Ids whose latest copy was written to `tp` (its owner answers their markers)."""
        with self._lock:
            return self._copies.on(tp)

    def verdict_for(
        self, message_id: str, after: tuple[int, int, int] | None, due_ms: int
    ) -> Verdict:
        with self._lock:
            slots = self._slots
            markers = [slots.marker(s) for s in self._chain(slots.head(message_id))]
            return verdict(markers, after, due_ms, self.executed)

    def entries(self, tp: TP, limit: int | None = None, now_ms: int | None = None) -> list[Entry]:
        """The markers the owner of `tp` has yet to answer; at most `limit` of them, the
        next ones each time (a flood is served a batch at a time, round the partition's
        markers, not all on every pass of the forwarder). Parked ones (`park`) are left
        out until `now_ms` reaches their time."""
        with self._lock:
            t = self._tps.get(tp)
            if t is None:
                return []
            return [self._entry_of(slot) for slot in self._slots.turns.pick(t, limit, now_ms)]

    def park(self, tp: TP, until: list[tuple[Entry, int]]) -> list[tuple[Entry, str]]:
        """Nothing can be decided about these markers (entry, time) before their time
        (their messages are not queued and not due yet): `entries` leaves them out until
        then, or until `unpark_named` or a final state of their message brings them
        back, so a flood of markers of no message is looked at once, not on every pass.
        An entry made before the book compacted names a slot that is gone, and one
        answered since is done: both are passed over. Returns those whose message is
        done for good, with its final state, to be answered now instead."""
        with self._lock:
            t = self._tps.get(tp)
            if t is None:
                return []
            return self._slots.turns.park(t, until, self.final_of)

    def parked_on(self, tp: TP) -> int:
        t = self._tps.get(tp)
        return 0 if t is None else self._slots.turns.parked_on(t)

    def unpark_named(self, tp: TP, raw_ids: list[bytes]) -> None:
        """Records of these ids (as records carry them) were read on `tp`: their parked
        markers come back at once."""
        with self._lock:
            t = self._tps.get(tp)
            if t is None or not self._slots.turns.parked_on(t):
                return
            cols = self._cols
            turns = self._slots.turns
            for raw_id in raw_ids:
                for slot in self._chain(self._ids.head(raw_id)):
                    if cols.tp[slot - cols.base] == t:
                        turns.unpark(slot)

    def unpark_all(self, tp: TP) -> None:
        """Every parked marker of `tp` comes back (its queue starts over)."""
        with self._lock:
            t = self._tps.get(tp)
            if t is not None:
                self._slots.turns.unpark_all(t)

    def has_unresolved(self, tp: TP) -> bool:
        t = self._tps.get(tp)
        return t is not None and self._slots.turns.has_unresolved(t)

    def is_answered(self, key: bytes) -> bool:
        with self._lock:
            return self._answers.is_answered(key)

    def is_executed(self, key: bytes) -> bool:
        with self._lock:
            return self._answers.is_executed(key)

    # -- what a forwarder decided ----------------------------------------------------
    def apply(self, action: Action) -> None:
        """Note an interval's decisions at once (they count while it is open)."""
        with self._lock:
            self._answers.apply(action)

    def take_back(self, action: Action) -> None:
        """The interval did not commit: its decisions are made again."""
        with self._lock:
            self._answers.take_back(action)
            self.touch()

    # -- forgetting ------------------------------------------------------------------
    def expire(self, before_ms: int) -> int:
        """Forget the markers appended before `before_ms`; returns how many went."""
        with self._lock:
            gone = self._slots.expire(before_ms)
            self._orphans.expire(before_ms)
            self._cut()
            self.measure()
            return gone

    def shed(self) -> int:
        """While the book is at its share: let go of the markers whose committed answer
        leaves nothing to decide (no message, or sent already, or refused), and of the
        answers read before their markers (but for moves carried out): a marker read
        again, or read without its answer, is answered again, to the same outcome."""
        with self._lock:
            if not self.at_share():
                return 0
            self._orphans.shed()
            cols = self._cols
            sheddable = self._answers.codes(SHEDDABLE)
            gone = 0
            for slot in range(max(self._slots.first_live, cols.base), cols.end):
                i = slot - cols.base
                flags = cols.flags[i]
                if flags & st.LIVE and flags & st.READ_BACK and cols.answer[i] in sheddable:
                    self._slots.forget(slot)
                    gone += 1
            self.shed_count += gone
            if gone:
                self._compact()
            self.measure()
            return gone

    def _cut(self) -> None:
        if self._slots.cut():
            self._compact()

    def measure(self) -> int:
        """Count what the book holds again (`total_bytes`)."""
        with self._lock:
            loose = self._orphans.count() + len(self._copies) + len(self._slots.asked)
            self.total_bytes = (
                self._slots.nbytes()
                + sum(len(reason) + 100 for _, reason in self._refusal_names)
                + LOOSE_BYTES * loose
            )
            return self.total_bytes

    def at_share(self, resuming: bool = False) -> bool:
        """Whether the book has reached its share of the budget (`resuming`: whether it
        is still above the level it takes markers again at)."""
        if self.max_bytes is None:
            return False
        limit = self.max_bytes * (RESUME_RATIO if resuming else 1.0)
        return self.total_bytes >= limit

    def kept(self) -> dict[str, int]:
        """How many markers are kept, by kind."""
        with self._lock:
            return {kind: n for kind, n in self._slots.kept.items() if n}

    def retire(self, topic: str) -> int:
        """`topic` (the markers topic) was deleted and made again: its new markers reuse
        the old ones' offsets, so the old ones stop being found by their answer keys
        and are not answered any more (an answer would name a new marker); they stay
        for the verdicts of the records they may concern. Returns how many."""
        with self._lock:
            retired = 0
            for (name, partition), source in list(self._sources.items()):
                if name != topic:
                    continue
                del self._sources[(name, partition)]  # a new source from the next marker
                for slot in self._slots.live_slots():
                    i = slot - self._cols.base
                    if self._cols.source[i] == source and self._cols.answer[i] == 0:
                        self._answers.answered(slot, b"", "superseded")
                        retired += 1
            self.touch()
            return retired

    def partition_count(self, topic: str, count: int) -> None:
        self._placing.partition_count(topic, count)

    def beyond_count(self, message_id: str, named: int | None = None) -> bool:
        """`Placing.beyond_count` (`named`: the id's `tail_partition`, if at hand)."""
        return self._placing.beyond_count(message_id, named)

    def past_every_count(self, partition: int) -> bool:
        """Whether no level topic has `partition`, by the counts last read (all of them
        before any was read)."""
        return partition >= self._placing.most

    # -- what the views show (`views`) -----------------------------------------
    def watched(self, tp: TP) -> bool:
        """Whether a marker kept names a message on `tp`."""
        t = self._tps.get(tp)
        return t is not None and bool(self._slots.watch_n.get(t))

    def watch_dict(self) -> dict[TP, set[bytes]]:
        with self._lock:
            out: dict[TP, set[bytes]] = {}
            for slot in self._slots.live_slots():
                if self._cols.refusal[slot - self._cols.base] < 0:
                    entry = self._entry_of(slot)
                    out.setdefault(entry.tp, set()).add(entry.marker.message_id.encode())
            return out

    def entry(self, key: bytes) -> Entry | None:
        """The entry of the marker answered under `key`, if kept."""
        with self._lock:
            slot = self._slots.slot_of(key)
            return None if slot < 0 else self._entry_of(slot)

    def all_entries(self) -> list[Entry]:
        with self._lock:
            return [self._entry_of(s) for s in self._slots.live_slots()]

    def kept_count(self) -> int:
        return sum(self._slots.kept.values())

    def live_slots(self) -> Iterator[int]:
        return self._slots.live_slots()
