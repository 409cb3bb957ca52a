"""How far the intake of a precise topic got, per partition, kept beside its slot files.

The intake commits its offsets to Kafka asynchronously, after the slot writes they
cover are synced, so a kill -9 before the broker has them makes the restarted intake
read those records again, and so does any lag of the broker's committed offset (a
commit that failed, offsets that expired). A record read again whose slot is still on
disk is held once (see `slot_index` and `slot_ledger.FileOffsets`), but one whose slot
was sent and deleted meanwhile would be written into a new slot and sent again. So
this file keeps two offsets per partition:

- `resume`: the last offset the intake committed (every record below it is durable
  here, `offset_ledger`); a restart reads the partition from the later of this and the
  broker's committed offset (`PartitionReading._start_positions`);
- `written`: the end of the last batch the intake began to write. Records from
  `resume` to `written` may sit in slot files without having been committed: a restart
  reads them again, and the partition's slots stay on disk and in memory until it has
  (`Wheel.read_again`), so a copy read again always finds the first one and is dropped.

File `{data_dir}/{topic}.offsets`: per partition p, two 32-byte records at 64 p and
64 p + 32, written in turn, each a sequence number, both offsets and a CRC32 of them;
the whole record with the higher sequence number counts. A write goes to the page
cache, which outlives the process, and is never synced: after a machine crash an
older value or none may be read, and the intake then reads more again, as it would
without this file. `resume` is written only after the slot writes it covers were
synced, and `written` before any write of its batch, so no crash can leave `resume`
ahead of what is on disk or `written` behind it.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final, NamedTuple

from delayservice.precise.storage.storage_fault import StorageError, ignore, reported

_RECORD = struct.Struct("<QqqI")  # sequence number, resume, written, crc32 of the three
_BODY = struct.Struct("<Qqq")
RECORD_BYTES: Final = 32
PARTITION_BYTES: Final = 2 * RECORD_BYTES


def intake_offsets_path(data_dir: Path, topic: str) -> Path:
    return data_dir / f"{topic}.offsets"


class IntakeOffsetsError(StorageError):
    """The file could not be read or written; the message names the path."""


class Reached(NamedTuple):
    sequence: int
    resume: int  # -1: no commit noted yet
    written: int


def _encode(reached: Reached) -> bytes:
    body = _BODY.pack(*reached)
    return (body + struct.pack("<I", zlib.crc32(body))).ljust(RECORD_BYTES, b"\0")


def _newest(data: bytes) -> Reached | None:
    """The newer whole record of one partition's two, or None."""
    best: Reached | None = None
    for start in (0, RECORD_BYTES):
        piece = data[start : start + _RECORD.size]
        if len(piece) < _RECORD.size:
            continue
        sequence, resume, written, crc = _RECORD.unpack(piece)
        if sequence == 0 or crc != zlib.crc32(piece[: _BODY.size]) or written < resume:
            continue  # never written, or torn
        if best is None or sequence > best.sequence:
            best = Reached(sequence, resume, written)
    return best


class IntakeOffsets:
    def __init__(self, path: Path, on_fault: Callable[[StorageError], None] = ignore) -> None:
        self._path = path
        self.on_fault = on_fault
        self._lock = threading.Lock()
        self._reached: dict[int, Reached] = {}
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            data = b""
            while chunk := os.pread(self._fd, 1 << 20, len(data)):
                data += chunk
        except OSError as exc:
            raise IntakeOffsetsError(f"cannot open {path}: {exc}") from exc
        for partition in range(len(data) // PARTITION_BYTES + 1):
            start = partition * PARTITION_BYTES
            newest = _newest(data[start : start + PARTITION_BYTES])
            if newest is not None:
                self._reached[partition] = newest

    def resume(self, partition: int) -> int | None:
        """Where the intake may resume `partition`: every record below is durable here
        (None: no commit noted)."""
        with self._lock:
            reached = self._reached.get(partition)
        return None if reached is None or reached.resume < 0 else reached.resume

    def in_flight(self) -> dict[int, int]:
        """Per partition whose last batch began to be written but was never committed,
        where that batch ended: records up to there may be in slot files already."""
        with self._lock:
            return {p: r.written for p, r in self._reached.items() if r.written > r.resume}

    def written(self, partition: int) -> int:
        """The end of the furthest batch of `partition` begun to be written (-1: none).
        A record below it may sit in a slot file already, written by an earlier process
        or an earlier try of its batch, even when its offset never committed."""
        with self._lock:
            reached = self._reached.get(partition)
        return -1 if reached is None else reached.written

    @reported
    def wrote(self, ends: Iterable[tuple[int, int]]) -> None:
        """(partition, offset) pairs: a batch ending before `offset` is about to be
        written. Call before any of its writes."""
        with self._lock:
            for partition, end in ends:
                old = self._reached.get(partition)
                if old is None:
                    self._put(partition, -1, end)
                elif end > old.written:
                    self._put(partition, old.resume, end)

    @reported
    def committed(self, offsets: Iterable[tuple[int, int]]) -> None:
        """(partition, offset) pairs: every record of the partition below `offset` is
        durable here. Call only once the writes they cover are synced."""
        with self._lock:
            for partition, offset in offsets:
                old = self._reached.get(partition)
                self._put(partition, offset, max(offset, old.written if old else offset))

    def _put(self, partition: int, resume: int, written: int) -> None:
        if partition < 0 or written < 0:
            raise ValueError(f"bad partition {partition} or offset {written}")
        old = self._reached.get(partition)
        reached = Reached((old.sequence if old else 0) + 1, resume, written)
        position = partition * PARTITION_BYTES + (reached.sequence % 2) * RECORD_BYTES
        try:
            count = os.pwrite(self._fd, _encode(reached), position)
        except OSError as exc:
            raise IntakeOffsetsError(f"cannot write {self._path}: {exc}") from exc
        if count != RECORD_BYTES:
            raise IntakeOffsetsError(f"short write to {self._path}: {count} bytes")
        self._reached[partition] = reached

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
