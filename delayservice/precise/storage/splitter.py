"""Moving a span's records into finer files as its time comes near (see `tiers`).

A span is streamed a chunk at a time: each whole frame is copied as it is (no parse,
no re-encoding; the fixed fields say when it fires) to the file the current tier
boundaries give its second, one write per destination file per chunk. Once every
chunk is written the destinations are synced, and only then is the span deleted whole
(and that deletion synced). A crash in between leaves the span, which is split again
after the restart: the records copied twice are dropped when their slot is loaded
(slots drop repeated offsets), so a re-split yields no duplicate. A cancelled record
is carried along like any other; the cancel log stops it when its slot loads.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Final

from delayservice.precise.storage.slot_index import read_chunk
from delayservice.precise.storage.slot_store import Key, SlotStore

log = logging.getLogger(__name__)

CHUNK: Final = 4 * 1024 * 1024
"""Bytes of a span in memory at a time while it is split."""

Place = Callable[[Key, dict[int, list[bytes]]], None]
"""Writes one chunk's frames, grouped by second, to their files (under the wheel's
lock, with the tier boundaries of that moment)."""


def split(store: SlotStore, span: Key, size: int, takeover_ms: int, place: Place) -> int:
    """Copy the first `size` bytes of `span` into finer files, sync them, delete the
    span. Returns the records copied."""
    copied = 0
    position = 0
    read_at = functools.partial(store.read_at, span)
    while position < size:
        chunk, found, end = read_chunk(read_at, position, size, takeover_ms, CHUNK)
        if end == 0:
            if chunk:
                log.warning("span %s: torn tail of %d bytes dropped", span, size - position)
            break
        view = memoryview(chunk)
        by_second: dict[int, list[bytes]] = {}
        for frame in found:
            if frame.settled:
                continue  # spans are never marked; nothing to carry
            second = frame.fire_ms // 1000
            by_second.setdefault(second, []).append(bytes(view[frame.start : frame.end]))
            copied += 1
        place(span, by_second)
        position += end
    store.sync()
    store.delete(*span)
    store.sync()  # the deletion too: a span back after a crash would be split again
    return copied
