"""Count the precise-mode messages an instance holds on disk, by due class.

A slot or span file is a run of frames, each a record or a settled mark; walking the
frame headers (`slot_file.frames`) gives every record's offset, due time and whether it
is a replica's copy without parsing bodies, so a census reads the files once, in
order, and holds only one file's settled offsets at a time. It runs beside a live
daemon: a file deleted meanwhile is skipped (its records were settled), and a torn
tail ends the walk as it would a restart.

A message whose cancel the daemon holds (its cancel file) is not counted, though it
stays on disk until its slot is loaded. A rescheduled message has several copies on
disk, and the reschedule log names the live one: only that one counts, at its own due
time, as the wheel would send only it. What a census cannot see: during a span split,
records copied to their slots and not yet deleted from the span count twice until the
split deletes the span (seconds).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from delayservice.precise.storage import due_buckets
from delayservice.precise.storage.data_dir import reschedule_log_path
from delayservice.precise.storage.reschedule_log import Move, pending_moves
from delayservice.precise.storage.slot_file import Frame, frame_length, frames, message_id_of
from delayservice.precise.storage.slot_store import partition_dirs

CHUNK = 4 << 20


@dataclass
class Census:
    """Owner copies are the messages this instance will send; replica copies are what
    it holds for another member and sends only on takeover."""

    owner: dict[str, int] = field(default_factory=due_buckets.empty)
    replica: dict[str, int] = field(default_factory=due_buckets.empty)
    earliest_due_ms: int | None = None  # of the owner copies
    files: int = 0
    bytes: int = 0

    @property
    def owned(self) -> int:
        return sum(self.owner.values())

    @property
    def replicas(self) -> int:
        return sum(self.replica.values())


def count_files(root: Path) -> int:
    """How many files a census of `root` reads (for a progress bar)."""
    if not root.is_dir():
        return 0
    return sum(sum(1 for _ in entries) for _, entries in partition_dirs(root))


def take_census(
    root: Path,
    now_ms: int,
    cancelled: Container[str] | None = None,
    on_file: Callable[[int], None] | None = None,
) -> Census:
    """Count what `root` (one precise topic's directory of an instance) holds, leaving
    out the ids in `cancelled` and the copies its reschedule log does not name live;
    `on_file(bytes)` is called after each file."""
    census = Census()
    if not root.is_dir():
        return census
    # The log before the files: a move made while the files are walked writes its copy
    # before its entry, so that copy is an orphan or superseded here and the message
    # counts once, by the copy this reading names (or its original).
    skip = _Skip(cancelled or (), pending_moves(reschedule_log_path(root.parent, root.name)))
    for _partition, entries in partition_dirs(root):
        for _key, path, _size in entries:
            size = _count_file(path, now_ms, census, skip)
            census.files += 1
            census.bytes += size
            if on_file is not None:
                on_file(size)
    return census


class _Skip:
    """Which record frames will never be sent: their id is cancelled, or another copy
    of it is live (`RescheduleLog.superseded` decides the same for the wheel)."""

    def __init__(self, cancelled: Container[str], moves: Mapping[str, Move]) -> None:
        self._cancelled = cancelled
        self._moves = moves

    def __call__(self, data: bytes, frame: Frame) -> bool:
        moves = self._moves
        if not (frame.copy or moves or self._cancelled):
            return False  # the common case: no id to read
        message_id = message_id_of(data, frame)
        if message_id is None:
            return frame.copy  # not an id any entry can name: a copy of it is an orphan
        if message_id in self._cancelled:
            return True
        move = moves.get(message_id)
        if move is None:
            return frame.copy  # a copy no entry names: its move did not complete
        return frame.offset != move.version


def _count_file(path: str, now_ms: int, census: Census, skip: _Skip) -> int:
    """Add one file's unsettled records to `census`; returns the bytes read."""
    records: dict[int, tuple[int, bool]] = {}  # offset -> (due ms, replica)
    settled: set[int] = set()
    read = 0
    try:
        with open(path, "rb") as file:
            data = b""
            while True:
                chunk = file.read(CHUNK)
                read += len(chunk)
                data = data + chunk if data else chunk
                found, end = frames(data)
                for frame in found:
                    if frame.settled:
                        settled.add(frame.offset)
                    elif skip(data, frame):
                        settled.add(frame.offset)  # will never be sent
                    else:
                        records[frame.offset] = (frame.fire_ms, frame.replica)
                data = data[end:]
                need = frame_length(data)
                if not chunk or (need is not None and len(data) >= need):
                    break  # the end, a torn tail, or a damaged frame: where a restart stops
                if need is not None and need > CHUNK:  # one frame larger than a chunk
                    more = file.read(need - len(data))
                    read += len(more)
                    data += more
    except FileNotFoundError:  # settled and deleted while this census ran
        return read
    bucket_of = due_buckets.bucket_of
    for offset, (due_ms, replica) in records.items():
        if offset in settled:
            continue
        counts = census.replica if replica else census.owner
        counts[bucket_of(due_ms, now_ms)] += 1
        if not replica and (census.earliest_due_ms is None or due_ms < census.earliest_due_ms):
            census.earliest_due_ms = due_ms
    return read
