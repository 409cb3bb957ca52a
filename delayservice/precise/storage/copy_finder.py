"""Finding the stored copies of a message by its id, for a reschedule.

Nothing on disk is indexed by id: an index would cost memory per pending message, and
a year of pending messages must stay within a few MiB. A reschedule is rare next to
the messages it moves, so it reads its partition's files instead, a chunk at a time:
a byte search for the ids (in C, at memory speed) picks the few files that can hold
one, and only those are read whole and walked frame by frame. So a search costs a
read of the partition's files (in the page cache when recently written) and memory
for one chunk plus the files that match.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from delayservice.precise.storage.slot_file import StoredRecord, frames, message_id_of, parse_frame
from delayservice.precise.storage.slot_store import Key

CHUNK: Final = 4 * 1024 * 1024
"""Bytes searched at a time."""

ReadAt = Callable[[Key, int, int], bytes]
"""Reads (file, position, length), like `SlotStore.read_at`."""


def _holds_any(read_at: ReadAt, key: Key, size: int, needles: list[bytes]) -> bool:
    """Whether the first `size` bytes of a file contain one of `needles`; chunks overlap
    by the longest needle, so one cut in two is still found."""
    overlap = max(map(len, needles)) - 1
    position = 0
    while position < size:
        data = read_at(key, position, min(CHUNK + overlap, size - position))
        if not data:
            return False  # deleted meanwhile
        if any(needle in data for needle in needles):
            return True
        position += CHUNK
    return False


def find_copies(
    files: Iterable[tuple[Key, int]], read_at: ReadAt, message_ids: set[str]
) -> dict[str, list[StoredRecord]]:
    """Per id of `message_ids`, the stored copies not marked settled, from the first
    `size` bytes of each (file, size). A file deleted meanwhile reads as empty."""
    if not message_ids:
        return {}
    needles = [message_id.encode("utf-8", "surrogatepass") for message_id in message_ids]
    found: dict[str, list[StoredRecord]] = {}
    for key, size in files:
        if not _holds_any(read_at, key, size, needles):
            continue
        data = read_at(key, 0, size)
        walked, _ = frames(data)
        settled = {frame.offset for frame in walked if frame.settled}
        for frame in walked:
            if frame.settled or frame.offset in settled:
                continue
            message_id = message_id_of(data, frame)
            if message_id is not None and message_id in message_ids:
                found.setdefault(message_id, []).append(
                    parse_frame(memoryview(data)[frame.start : frame.end])
                )
    return found
