"""The marker book's slots: one columns object (`store`) and every index over it
(where each marker landed, each id's chain, the asked due times, the counts the book
answers from, the append-time order markers are forgotten in, the owners' turns), and
how a slot is found and read (by answer key, by id, as a `LevelMarker`).

Apart from the book because all of it starts over together: slots renumber when the
book compacts (`compacted`), and a fresh `Slots` is made with the fresh columns, where
the book keeps what outlives its columns (the small tables of sources, partitions and
refusals, the outcomes' in `answers`, what has no marker kept, the copies) and
the lock.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Final

from delayservice.level.markers import store as st
from delayservice.level.markers.copies import Copies
from delayservice.level.markers.orphans import OrphanAnswers
from delayservice.level.markers.turns import Turns
from delayservice.level.markers.verdict import LevelMarker
from delayservice.markers.replies import CANCEL, CANCELLED, RESCHEDULE

SLOT_BITS: Final = 64
"""Wider than any slot number (they number on across compactions), so one never spills
into the append time and a straggler is never taken for another slot."""
SLOT_MASK: Final = (1 << SLOT_BITS) - 1
STRAGGLER_BYTES: Final = 48
"""A straggler's place in its heap: a pointer and one int of four digits."""

Row = tuple[int, int, int, int, int, int, bytes]
"""(append time, offset, source, level partition, refusal, flags, id) of a slot."""


def _straggler(appended_ms: int, slot: int) -> int:
    """One int that orders by append time: an entry of the stragglers' heap costs
    48 bytes, where a tuple of two cost 120."""
    return (appended_ms << SLOT_BITS) | slot


def _split_key(key: bytes) -> tuple[str, int, int] | None:
    topic, _, rest = key.rpartition(b":")
    topic, _, partition = topic.rpartition(b":")
    if not (rest.isdigit() and partition.isdigit()):
        return None
    try:
        return topic.decode(), int(partition), int(rest)
    except UnicodeDecodeError:
        return None


def final_flag(state: str) -> int:
    return st.FINAL_CANCELLED if state == CANCELLED else st.FINAL_OTHER


class Slots:
    __slots__ = (
        "_copies",
        "_orphans",
        "_source_names",
        "_sources",
        "asked",
        "by_source",
        "cols",
        "first_live",
        "ids",
        "kept",
        "latest_ms",
        "stragglers",
        "turns",
        "watch_n",
    )

    def __init__(
        self,
        cols: st.Columns,
        sources: dict[tuple[str, int], int],
        source_names: list[tuple[str, int]],
        orphans: OrphanAnswers,
        copies: Copies,
    ) -> None:
        """Empty slots over empty `cols`; `sources`: the book's table of (markers topic,
        partition) -> its code, and `source_names` the other way."""
        self.cols = cols
        self._sources = sources
        self._source_names = source_names
        self._orphans = orphans
        self._copies = copies
        self.ids = st.IdTable(self.id_bytes)
        self.by_source: list[st.Source] = []
        """Per source, its slots in offset order."""
        self.asked: dict[int, int] = {}
        """Slot -> a reschedule's new due time."""
        self.turns = Turns(cols)
        self.watch_n: dict[int, int] = {}
        """Level partition -> how many of its markers name a message (not refused)."""
        self.kept = {CANCEL: 0, RESCHEDULE: 0}
        self.stragglers: list[int] = []
        """`_straggler(append time, slot)` of the slots filed with an append time before an earlier
        slot's, as a heap (`expire`): while one partition's backlog is read beside the
        others (a flood after a restart) nearly every marker of it is one, and a list
        looked through on every pass of the reader made the reading quadratic."""
        self.latest_ms = 0
        self.first_live = cols.base

    def raw(self, slot: int) -> tuple[bytes, bool]:
        flags = self.cols.flags[slot - self.cols.base]
        return self.cols.raw_id(slot), bool(flags & st.PACKED)

    def id_bytes(self, slot: int) -> bytes:
        """The id of `slot` as records carry it."""
        raw, packed = self.raw(slot)
        return raw if not packed else st.unpack_id(raw, packed).encode()

    def flags(self, slot: int) -> int:
        return self.cols.flags[slot - self.cols.base]

    def set_flags(self, slot: int, on: int = 0, off: int = 0) -> None:
        """Clear `off`, then set `on` (so `on` wins where they meet)."""
        i = slot - self.cols.base
        self.cols.flags[i] = (self.cols.flags[i] & ~off) | on

    def live(self, slot: int) -> bool:
        return slot >= self.cols.base and bool(self.flags(slot) & st.LIVE)

    def find(self, topic: str, partition: int, offset: int) -> int:
        """The live slot of the marker at `offset` of (`topic`, `partition`); -1: none."""
        source = self._sources.get((topic, partition))
        if source is None:
            return -1
        slot = self.by_source[source].find(offset, self.offset_of, self.cols.base)
        return slot if slot >= 0 and self.live(slot) else -1

    def slot_of(self, key: bytes) -> int:
        """The live slot of the marker answered under `key`; -1 when none is kept."""
        where = _split_key(key)
        return -1 if where is None else self.find(*where)

    def head(self, message_id: str) -> int:
        return self.ids.head(message_id.encode())

    def chain(self, head: int) -> Iterator[int]:
        cols = self.cols
        slot = head
        while slot >= 0:
            yield slot
            slot = cols.next[slot - cols.base]

    def marker(self, slot: int) -> LevelMarker:
        cols = self.cols
        i = slot - cols.base
        raw, packed = self.raw(slot)
        topic, partition = self._source_names[cols.source[i]]
        kind = RESCHEDULE if cols.flags[i] & st.RESCHEDULE_KIND else CANCEL
        return LevelMarker(
            kind,
            st.unpack_id(raw, packed),
            cols.appended[i],
            topic,
            partition,
            cols.offset[i],
            self.asked.get(slot),
        )

    def offset_of(self, slot: int) -> int:
        return self.cols.offset[slot - self.cols.base]

    def live_slots(self) -> Iterator[int]:
        cols = self.cols
        for slot in range(max(self.first_live, cols.base), cols.end):
            if cols.flags[slot - cols.base] & st.LIVE:
                yield slot

    # -- in and out of every index ---------------------------------------------------
    def add(self, row: Row, answer: int, asked: int | None, message_id: str | None = None) -> int:
        """A new slot, in every index (`message_id`: the id unpacked, if at hand)."""
        appended, offset, source, tp, refusal, flags, raw = row
        slot = self.cols.add(appended, offset, source, tp, refusal, flags, raw, answer)
        self.by_source[source].add(offset, slot)
        if asked is not None:
            self.asked[slot] = asked
        if appended < self.latest_ms:
            heapq.heappush(self.stragglers, _straggler(appended, slot))
        else:
            self.latest_ms = appended
        self.kept[RESCHEDULE if flags & st.RESCHEDULE_KIND else CANCEL] += 1
        if refusal < 0:
            packed = bool(flags & st.PACKED)
            message_id = message_id or st.unpack_id(raw, packed)
            self._link(slot, message_id.encode(), message_id)
            self.watch_n[tp] = self.watch_n.get(tp, 0) + 1
        if answer == 0:
            self.turns.unresolve(slot, tp)
        return slot

    def _link(self, slot: int, raw: bytes, message_id: str) -> None:
        head = self.ids.head_or_add(raw, slot)
        cols = self.cols
        if head >= 0:
            cols.next[slot - cols.base] = cols.next[head - cols.base]
            cols.next[head - cols.base] = slot
            final = self.flags(slot) & (st.FINAL_CANCELLED | st.FINAL_OTHER)
            if final:  # kept on the first slot of the id (compacting files them again)
                self.set_flags(head, on=final)
                self.set_flags(slot, off=final)
            return
        if not self._orphans.loose_final:
            return  # the common case: no final state waits for an id (no call per marker)
        loose = self._orphans.take_final(message_id)
        if loose is not None:
            self.set_flags(slot, on=final_flag(loose))

    def forget(self, slot: int) -> None:
        cols = self.cols
        i = slot - cols.base
        flags = cols.flags[i]
        tp = cols.tp[i]
        self.turns.forgotten(slot)
        cols.flags[i] = flags & ~(st.LIVE | st.PARKED)
        kind = RESCHEDULE if flags & st.RESCHEDULE_KIND else CANCEL
        self.kept[kind] -= 1
        self.asked.pop(slot, None)
        if cols.refusal[i] >= 0:
            return
        self.watch_n[tp] -= 1
        raw = self.id_bytes(slot)
        head = self.ids.head(raw)
        final = flags & (st.FINAL_CANCELLED | st.FINAL_OTHER) if head == slot else 0
        if head == slot:
            following = cols.next[i]
            self.ids.set_head(raw, following)
            if following >= 0:
                self.set_flags(following, on=final)
            else:
                self._copies.note(raw.decode(), None)
        else:
            previous = head
            while previous >= 0 and cols.next[previous - cols.base] != slot:
                previous = cols.next[previous - cols.base]
            if previous >= 0:
                cols.next[previous - cols.base] = cols.next[i]
        cols.next[i] = -1

    # -- forgetting ------------------------------------------------------------------
    def expire(self, before_ms: int) -> int:
        """Forget the slots appended before `before_ms`; returns how many went."""
        cols = self.cols
        gone = 0
        slot = max(self.first_live, cols.base)
        while slot < cols.end:
            i = slot - cols.base
            if cols.flags[i] & st.LIVE:
                if cols.appended[i] >= before_ms:
                    break  # those filed after it were appended later (stragglers aside)
                self.forget(slot)
                gone += 1
            slot += 1
        self.first_live = slot
        stragglers = self.stragglers
        while stragglers and stragglers[0] >> SLOT_BITS < before_ms:
            straggler = heapq.heappop(stragglers) & SLOT_MASK
            if straggler >= self.first_live and self.live(straggler):
                self.forget(straggler)
                gone += 1
        return gone

    def cut(self) -> bool:
        """Give back what forgotten slots take once they outweigh what is kept: the
        front by a cut (a copy in C). Returns whether they are scattered, to be given
        back by compacting instead."""
        cols = self.cols
        while self.first_live < cols.end and not self.live(self.first_live):
            self.first_live += 1
        kept = sum(self.kept.values())
        front = self.first_live - cols.base
        if len(cols) - kept < max(256, kept):
            return False
        if front < len(cols) - kept:
            return True
        cols.cut(self.first_live)
        for source in self.by_source:
            source.cut(cols.base)
        self.ids.renumbered()
        return False

    def compacted(self) -> Slots:
        """The slots kept, copied to fresh columns, numbered on from the last (so every
        order holds), and indexed again: what `shed` and scattered forgetting free is
        given back. Costs a pass over what is kept, once the forgotten outweigh it."""
        old = self.cols
        rows = []
        for slot in self.live_slots():
            i = slot - old.base
            row = (
                old.appended[i],
                old.offset[i],
                old.source[i],
                old.tp[i],
                old.refusal[i],
                old.flags[i] & ~st.PARKED,  # slots renumber: parking starts over
                old.raw_id(slot),
            )
            rows.append((row, old.answer[i], self.asked.get(slot)))
        fresh = st.Columns()
        fresh.base = fresh.first_start = fresh.arena_base = old.end
        slots = Slots(fresh, self._sources, self._source_names, self._orphans, self._copies)
        slots.by_source = [st.Source() for _ in self.by_source]
        for row, answer, asked in rows:
            slots.add(row, answer, asked)
        slots.latest_ms = max(slots.latest_ms, self.latest_ms)
        return slots

    def nbytes(self) -> int:
        """What the columns and their indexes take."""
        return (
            self.cols.nbytes()
            + self.ids.nbytes()
            + sum(source.nbytes() for source in self.by_source)
            + self.turns.nbytes()
            + STRAGGLER_BYTES * len(self.stragglers)
        )
