"""A slot file read in two passes, so that a slot never has to fit in memory.

The first pass walks the file a chunk at a time and keeps, per record, only where it
is and when it fires: a sort key (millisecond within the second, offset, sequence) of
about 50 bytes and 12 bytes of position and length, against about 1 KB for a record
held in memory. The second pass (`take`) reads the records back in the order they
leave, a bounded batch at a time, as the wheel's memory budget allows; runs of records
that lie next to each other in the file (the usual case: a burst is appended in order)
are read with one call.

A record written twice (read again after a crash between write and commit, or copied
twice by a split that was interrupted) sorts next to its copy and is taken once;
records named by a settled mark are left out. The offsets it found (`offsets`) let the
wheel drop a further copy the intake appends while the slot is in memory, and `drop`
leaves out the file's copies of records the intake handed in while it was indexed.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Final

from delayservice.precise.storage.slot_file import (
    Frame,
    StoredRecord,
    frame_length,
    frames,
    parse_frame,
)

CHUNK: Final = 4 * 1024 * 1024
"""Bytes read at a time, in either pass."""
WINDOW_SLACK: Final = 64 * 1024
"""A read for records being taken may span this much whatever share of it is wanted."""
INDEX_BYTES_PER_RECORD: Final = 72
"""A sort key (a 107-bit int and its list slot), a position, a length and an offset."""
_SEQ_BITS: Final = 32
_OFFSET_BITS: Final = 64

ReadAt = Callable[[int, int], bytes]  # (position, length) -> bytes


def read_chunk(
    read_at: ReadAt, position: int, size: int, takeover_ms: int, chunk: int = CHUNK
) -> tuple[bytes, list[Frame], int]:
    """The whole frames of a file from `position`, about `chunk` bytes of them (one
    frame bigger than that is read whole): the bytes, the frames, and where they stop
    (0: a torn tail, nothing whole follows before `size`)."""
    data = read_at(position, min(size - position, chunk))
    found, end = frames(data, takeover_ms)
    if end == 0:
        whole = frame_length(data)
        if whole is None or whole <= len(data) or position + whole > size:
            return data, [], 0
        data = read_at(position, whole)
        found, end = frames(data, takeover_ms)
    return data, found, end


class SlotIndex:
    def __init__(self, read_at: ReadAt, size: int, second: int, takeover_ms: int) -> None:
        self._read_at = read_at
        self._positions = array("q")
        self._lengths = array("l")
        self._offsets = array("q")  # in file order: nearly sorted
        keys: list[int] = []
        settled: set[int] = set()
        base_ms = second * 1000
        position = 0
        while position < size:
            _, found, end = read_chunk(read_at, position, size, takeover_ms)
            if end == 0:
                break  # a torn tail: nothing whole follows
            for frame in found:
                if frame.settled:
                    settled.add(frame.offset)
                    continue
                millisecond = min(max(frame.fire_ms - base_ms, 0), 1 << 20)
                seq = len(self._positions)
                self._positions.append(position + frame.start)
                self._lengths.append(frame.end - frame.start)
                self._offsets.append(frame.offset)
                keys.append(
                    (millisecond << (_OFFSET_BITS + _SEQ_BITS)) | (frame.offset << _SEQ_BITS) | seq
                )
            position += end
        keys.sort()
        self._keys = keys
        self._settled = settled
        self._next = 0
        self._last_offset = -1
        self.bytes = sum(self._lengths)
        """Bytes of record frames in the slot (duplicates and settled included)."""
        self.memory = len(keys) * INDEX_BYTES_PER_RECORD
        """What the index costs in memory while the slot loads, estimated."""

    def __len__(self) -> int:
        """Records (copies included) not yet taken."""
        return len(self._keys) - self._next

    @property
    def frame_bytes(self) -> int:
        """Mean size of a record's frame here, for the wheel's memory estimate."""
        return self.bytes // max(1, len(self._positions))

    def next_millisecond(self) -> int | None:
        """Millisecond within the second of the next record to take (None: all taken)."""
        if self._next >= len(self._keys):
            return None
        return self._keys[self._next] >> (_OFFSET_BITS + _SEQ_BITS)

    def offsets(self) -> array[int]:
        """The offsets of the records found, sorted (once: the index lets them go). A
        file is appended to in offset order, so the sort is a pass."""
        found, self._offsets = self._offsets, array("q")
        return array("q", sorted(found))

    def drop(self, offsets: list[int]) -> None:
        """Leave out the records with these offsets: a copy is held already."""
        self._settled.update(offsets)

    def take(self, count: int) -> list[StoredRecord]:
        """The next records in leaving order, at most `count` (fewer, even none, when
        copies or settled records are skipped); reads what they need and no more."""
        keys = self._keys[self._next : self._next + count]
        self._next += len(keys)
        seq_mask = (1 << _SEQ_BITS) - 1
        offset_mask = (1 << _OFFSET_BITS) - 1
        wanted: list[int] = []
        last = self._last_offset
        for key in keys:
            offset = (key >> _SEQ_BITS) & offset_mask
            if offset == last or offset in self._settled:
                continue  # a second copy sorts right after the first
            last = offset
            wanted.append(key & seq_mask)
        self._last_offset = last
        if self._next >= len(self._keys):
            self._keys = []  # all taken: let the index go
            self._next = 0
        return self._read(wanted)

    def _read(self, seqs: list[int]) -> list[StoredRecord]:
        """The records `seqs` names, in that order. A slot's records leave in due order
        but were appended as they came: with delays spread over seconds, neighbours in
        leaving order are far apart in the file, and a read per record cost the loader
        an open, a pread and a close each (5,000 a second at 5,000 msg/s; a third of the
        loader's samples). So the records are read in file order, in windows of at most
        `CHUNK` bytes that are mostly wanted (`_window_end`), and handed back in
        leaving order."""
        positions, lengths = self._positions, self._lengths
        by_position = sorted(range(len(seqs)), key=lambda i: positions[seqs[i]])
        found: list[StoredRecord | None] = [None] * len(seqs)
        k = 0
        while k < len(by_position):
            start = positions[seqs[by_position[k]]]
            stop, end = self._window_end(seqs, by_position, k)
            data = memoryview(self._read_at(start, end - start))
            for i in by_position[k:stop]:
                seq = seqs[i]
                position = positions[seq] - start
                piece = data[position : position + lengths[seq]]
                if len(piece) == lengths[seq]:  # the file went meanwhile: nothing to send
                    found[i] = parse_frame(piece)
            k = stop
        return [record for record in found if record is not None]

    def _window_end(self, seqs: list[int], by_position: list[int], k: int) -> tuple[int, int]:
        """From the `k`-th wanted record in file order: where a window stops (exclusive
        index into `by_position`) and the byte it ends at. It grows while it stays
        within `CHUNK` and at most a quarter of it is bytes not wanted (past a first
        64 KiB), so a few records wanted from a big slot do not read all of it."""
        positions, lengths = self._positions, self._lengths
        first = seqs[by_position[k]]
        start = positions[first]
        end = start + lengths[first]
        wanted = lengths[first]
        stop = k + 1
        while stop < len(by_position):
            seq = seqs[by_position[stop]]
            grown = max(end, positions[seq] + lengths[seq])
            size = grown - start
            if size > CHUNK or size > max(WINDOW_SLACK, (wanted + lengths[seq]) * 4 // 3):
                break
            end, wanted, stop = grown, wanted + lengths[seq], stop + 1
        return stop, end
