"""Splitting spans: a span file is split into finer files (`splitter`) one width of its
own before its first second, on a thread of its own, so the intake never waits for a
split and the files on disk stay bounded whatever the delays.
"""

from __future__ import annotations

import logging
import time
from typing import Final

from delayservice.precise.storage.slot_store import Key
from delayservice.precise.storage.splitter import split
from delayservice.precise.storage.storage_fault import StorageError
from delayservice.precise.wheel.heap_trim import release_free_heap
from delayservice.precise.wheel.wheel_state import UNBOUNDED, WheelState

log = logging.getLogger(__name__)

SPLIT_EVERY_S: Final = 1.0
TRIM_EVERY_S: Final = 1.0
TRIM_BELOW: Final = 32 * 1024 * 1024
"""Freed heap is given back only while the wheel holds less than this: while records
are being forwarded, pages given back would only be faulted in again."""


class SpanSplitting:
    def __init__(self, state: WheelState, takeover_s: float) -> None:
        self._state = state
        self._takeover_s = takeover_s

    def run_splits(self) -> None:
        """Splits spans as they come near; now and then, while little is held, gives
        freed heap back."""
        state = self._state
        next_trim = 0.0
        while not state.stopping.is_set():
            try:
                self.split_due_spans()
                if time.monotonic() >= next_trim and state.shared.total < TRIM_BELOW:
                    next_trim = time.monotonic() + TRIM_EVERY_S
                    release_free_heap()
            except StorageError as fault:  # reported by the store: the daemon is stopping
                log.debug("precise splitter stops on a storage fault: %s", fault)
                return
            except Exception:
                log.exception("precise splitter: unexpected error; continuing")
            state.stopping.wait(SPLIT_EVERY_S)

    def split_due_spans(self) -> int:
        """Move the boundaries to now, and split every span they have passed, earliest
        first, into finer files. Returns the spans split."""
        state = self._state
        done = 0
        while not state.stopping.is_set():
            with state.lock:
                bounds = state.tiers.boundaries(state.clock())
                state.bounds = tuple(map(max, state.bounds, bounds))
                due = [
                    span
                    for span in state.store.spans()
                    if state.tiers.due_for_split(span[1], span[2], state.bounds)
                ]
                if not due:
                    return done
                span = min(due, key=lambda key: (key[1], key[2]))
                size = state.store.size(*span) or 0  # nothing more is appended to it
            copied = split(state.store, span, size, int(self._takeover_s * 1000), self._place)
            with state.lock:
                state.span_floor.pop(span[0], None)
                for partition, start, _ in state.store.spans():
                    if partition == span[0]:
                        floor = state.span_floor.get(partition, UNBOUNDED)
                        state.span_floor[partition] = min(floor, start)
            log.debug("split span %s: %d records into finer files", span, copied)
            done += 1
            state.wake.set()  # its slots may be loadable now
        return done

    def _place(self, span: Key, by_second: dict[int, list[bytes]]) -> None:
        """Write one chunk of a span into the files the boundaries give now."""
        state = self._state
        partition = span[0]
        writes: dict[Key, list[bytes]] = {}
        with state.lock:
            place, bounds = state.tiers.place, state.bounds
            for second, frames in by_second.items():
                start, width = place(second, bounds)
                writes.setdefault((partition, start, width), []).extend(frames)
            state.write(writes)
