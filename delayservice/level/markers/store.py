"""Where the marker book keeps its markers: columns of fixed-size fields, not objects.

A marker kept as Python objects (the marker, its id string, its answer key, an entry,
and a slot in five dictionaries) cost about 1.1 KB; a flood of a million cost more than
a gigabyte outside every budget. Here a marker is a slot number, and each of its fields
one item of an `array` (`benchmarks/marker_book_memory.py` measures what one costs):
when it was appended, where it landed (markers partition, offset), which level
partition answers it, its refusal and answer (indexes into small tables of the distinct
texts), a byte of flags, and its id in one shared arena (a level id packed to 21 bytes:
its 32 hex digits as 16 bytes, then `-l<level>p<partition>`). Two indexes find a slot:
by where it landed (per markers partition, the slots in offset order, found by
bisection), and by id (an open-addressing table of the first slot of each id, the
others chained through `next`). Objects (`LevelMarker`, `Entry`) are made only when
asked for, for the few markers a question is about.

Slot numbers only grow. Markers are mostly filed in the order they were appended, so
they are forgotten from the front: once the forgotten front outweighs what is kept, the
columns and the arena are cut there (`base` moves on) at the cost of a copy in C.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable
from typing import Final, TypeVar

from delayservice.markers.level_ids import _LEVEL_ID

LIVE: Final = 1
EXECUTED: Final = 2
"""A reschedule carried out (its copy exists)."""
PLACED: Final = 4
"""Its id names a level partition here: the entry has a send time and a delay."""
READ_BACK: Final = 8
"""Its answer was read back from the outcomes topic (committed)."""
PACKED: Final = 16
"""Its id is kept packed (a level id)."""
FINAL_CANCELLED: Final = 32
FINAL_OTHER: Final = 64
"""The id's message is done for good (on the first slot of the id's chain)."""
RESCHEDULE_KIND: Final = 128
PARKED: Final = 256
"""Nothing can be decided about it before a time (its message not queued, and not due
yet): `entries` leaves it out until then, or until its message is read."""

_EMPTY: Final = -1
_GONE: Final = -2
_SLOT_BITS: Final = 36
"""Slot numbers below 2**36: markers filed over the life of a process."""
_SLOT_MASK: Final = (1 << _SLOT_BITS) - 1
_TAG_MASK: Final = (1 << 27) - 1
_TAG_BITS: Final = _TAG_MASK << _SLOT_BITS
_T = TypeVar("_T")


def pack_id(message_id: str, level_id: bool | None = None) -> tuple[bytes, bool]:
    """An id as the arena keeps it, and whether it is packed (`level_id`: whether it
    is known to be one)."""
    if level_id is None:
        level_id = len(message_id) > 36 and _LEVEL_ID.fullmatch(message_id) is not None
    if level_id:
        return bytes.fromhex(message_id[:32]) + message_id[32:].encode(), True
    return message_id.encode(), False


def unpack_id(raw: bytes, packed: bool) -> str:
    if packed:
        return raw[:16].hex() + raw[16:].decode()
    return raw.decode()


def code(table: dict[_T, int], names: list[_T], value: _T) -> int:
    """The index of `value` in a small table of distinct values (`names`; `table`: each
    to its index), added at its end when new: what a column keeps of a text."""
    code = table.get(value)
    if code is None:
        code = table[value] = len(names)
        names.append(value)
    return code


class Columns:
    """The fields of every slot from `base` on, and the arena of their ids."""

    def __init__(self) -> None:
        self.base = 0
        self.appended = array("q")
        self.offset = array("q")
        self.source = array("i")
        """Index of (markers topic, partition) in the book's table of sources."""
        self.tp = array("i")
        """Index of the level partition whose owner answers it."""
        self.refusal = array("h")
        """Index of (outcome, reason) in the book's table; -1: none."""
        self.answer = array("B")
        """Index of the outcome answered in the book's table; 0: not answered."""
        self.flags = array("H")
        self.next = array("q")
        """The next slot of the same id (-1: none)."""
        self.id_end = array("q")
        """Where each slot's id ends in the arena (absolute: `arena_base` is arena[0])."""
        self.arena = bytearray()
        self.arena_base = 0
        self.first_start = 0
        """Where the id of slot `base` starts (absolute)."""

    def __len__(self) -> int:
        return len(self.appended)

    @property
    def end(self) -> int:
        """The next slot number."""
        return self.base + len(self.appended)

    def add(
        self,
        appended: int,
        offset: int,
        source: int,
        tp: int,
        refusal: int,
        flags: int,
        raw_id: bytes,
        answer: int = 0,
    ) -> int:
        slot = self.base + len(self.appended)
        self.appended.append(appended)
        self.offset.append(offset)
        self.source.append(source)
        self.tp.append(tp)
        self.refusal.append(refusal)
        self.answer.append(answer)
        self.flags.append(flags)
        self.next.append(-1)
        self.arena += raw_id
        self.id_end.append(self.arena_base + len(self.arena))
        return slot

    def raw_id(self, slot: int) -> bytes:
        i = slot - self.base
        start = self.id_end[i - 1] if i > 0 else self.first_start
        return bytes(self.arena[start - self.arena_base : self.id_end[i] - self.arena_base])

    def cut(self, slot: int) -> None:
        """Drop every slot before `slot` (all forgotten)."""
        k = slot - self.base
        if k <= 0:
            return
        start = self.id_end[k - 1]
        for name in ("appended", "offset", "source", "tp", "refusal", "answer", "flags", "next"):
            setattr(self, name, getattr(self, name)[k:])
        self.id_end = self.id_end[k:]
        del self.arena[: start - self.arena_base]
        self.arena_base = start
        self.first_start = start
        self.base = slot

    def nbytes(self) -> int:
        arrays = (
            self.appended,
            self.offset,
            self.source,
            self.tp,
            self.refusal,
            self.answer,
            self.flags,
            self.next,
            self.id_end,
        )
        return sum(a.buffer_info()[1] * a.itemsize for a in arrays) + len(self.arena)


class IdTable:
    """Id -> the first slot of its chain: open addressing with linear probing over one
    array, rebuilt at two thirds full. A cell holds the slot number with 27 bits of the
    id's hash above it, which place it (so a rebuild needs no id) and spare a probe
    comparing ids unless they match. Ids are hashed
    as the UTF-8 bytes records carry them (`hash` caches it on the record's bytes)."""

    def __init__(self, id_of: Callable[[int], bytes]) -> None:
        self._id_of = id_of
        self._table = array("q", [_EMPTY]) * 16
        self._used = 0
        """Filled and tombstoned cells."""
        self.live = 0

    def _cell(self, raw: bytes) -> tuple[int, int, int]:
        """(cell holding the id or -1, first free cell on its probe path, its tag)."""
        table = self._table
        mask = len(table) - 1
        bits = hash(raw) & _TAG_MASK
        i = bits & mask
        tag = bits << _SLOT_BITS
        free = -1
        while True:
            cell = table[i]
            if cell == _EMPTY:
                return -1, (i if free < 0 else free), tag
            if cell == _GONE:
                if free < 0:
                    free = i
            elif cell & _TAG_BITS == tag and self._id_of(cell & _SLOT_MASK) == raw:
                return i, free, tag
            i = (i + 1) & mask

    def maybe(self, raws: list[bytes]) -> list[int]:
        """Positions of `raws` whose hash bits match a cell's: every id present is
        among them (a screen of a run of records, at a probe each)."""
        table = self._table
        mask = len(table) - 1
        out = []
        for pos, raw in enumerate(raws):
            bits = hash(raw) & _TAG_MASK
            i = bits & mask
            tag = bits << _SLOT_BITS
            cell = table[i]
            while cell != _EMPTY:
                if cell >= 0 and cell & _TAG_BITS == tag:
                    out.append(pos)
                    break
                i = (i + 1) & mask
                cell = table[i]
        return out

    def head(self, raw: bytes) -> int:
        cell, _, _ = self._cell(raw)
        return -1 if cell < 0 else self._table[cell] & _SLOT_MASK

    def head_or_add(self, raw: bytes, slot: int) -> int:
        """The id's first slot; or, when it has none, make it `slot` and return -1."""
        cell, free, tag = self._cell(raw)
        if cell >= 0:
            return self._table[cell] & _SLOT_MASK
        self._put(free, tag | slot)
        return -1

    def _put(self, free: int, value: int) -> None:
        if self._table[free] == _EMPTY:
            self._used += 1
        self._table[free] = value
        self.live += 1
        if self._used * 3 > len(self._table) * 2:
            self._rebuild()

    def set_head(self, raw: bytes, slot: int) -> None:
        """Point the id at `slot` (-1: the id has no slot left)."""
        cell, free, tag = self._cell(raw)
        if cell >= 0:
            if slot >= 0:
                self._table[cell] = tag | slot
            else:
                self._table[cell] = _GONE
                self.live -= 1
            return
        if slot >= 0:
            self._put(free, tag | slot)

    def _rebuild(self) -> None:
        cells = [cell for cell in self._table if cell >= 0]
        size = 16
        while size < len(cells) * 2 and size <= _TAG_MASK:
            size *= 2
        self._table = array("q", [_EMPTY]) * size
        self._used = self.live = 0
        mask = size - 1
        for cell in cells:  # the cell's tag holds the hash bits that place it
            i = (cell >> _SLOT_BITS) & mask
            while self._table[i] != _EMPTY:
                i = (i + 1) & mask
            self._table[i] = cell
            self._used += 1
            self.live += 1

    def renumbered(self) -> None:
        """After the columns were cut: the heads are the same slot numbers (they only
        grow), so nothing moves; rebuild only to sweep tombstones."""
        if self._used > 2 * self.live + 16:
            self._rebuild()

    def nbytes(self) -> int:
        return len(self._table) * self._table.itemsize


class Source:
    """One markers partition: its slots in offset order, and those read out of order
    (a rewind that re-reads what was forgotten) by offset."""

    __slots__ = ("last", "late", "slots")

    def __init__(self) -> None:
        self.slots = array("q")
        self.late: dict[int, int] = {}
        self.last = -1
        """The offset of the last of `slots` (-1: none): what a marker read in order
        is compared with, without a look at the columns."""

    def find(self, offset: int, offset_of: Callable[[int], int], base: int) -> int:
        late = self.late.get(offset)
        if late is not None:  # filed after the one in `slots`, forgotten since
            return late
        slots = self.slots
        if not slots or self.last < offset:
            return -1  # the common case: read in order, beyond every one kept
        lo = bisect_left(slots, base)  # slots before the columns' base are gone
        i = bisect_left(slots, offset, lo=lo, key=offset_of)
        if i < len(slots) and offset_of(slots[i]) == offset:
            return slots[i]
        return -1

    def add(self, offset: int, slot: int) -> None:
        if not self.slots or self.last < offset:
            self.slots.append(slot)
            self.last = offset
        else:
            self.late[offset] = slot

    def cut(self, base: int) -> None:
        k = bisect_left(self.slots, base)
        if k:
            self.slots = self.slots[k:]  # the last one stays, or none is left
        for offset in [o for o, s in self.late.items() if s < base]:
            del self.late[offset]

    def nbytes(self) -> int:
        return len(self.slots) * 8 + 100 * len(self.late)
