"""Loading slots: which slot to read in next, and reading its records into memory
under the byte budget.

A slot comes into memory when the pointer nears it (`lookahead`), earlier by its size
so a burst due in one second is read before it is due, through a `SlotIndex`
(positions and due milliseconds first, payloads a batch at a time) while the records
held stay under `max_buffered_bytes`: a burst due in one second drains with bounded
memory. Records a cancel or a reschedule has called off are settled as they are read.
"""

from __future__ import annotations

import functools
import heapq
import logging
import time
from typing import Final

from delayservice.precise.storage.cancel_log import CancelLog
from delayservice.precise.storage.slot_file import StoredRecord
from delayservice.precise.storage.slot_index import SlotIndex
from delayservice.precise.storage.slot_record import SlotRecord
from delayservice.precise.wheel.slot_ledger import FileOffsets, SlotTracker
from delayservice.precise.wheel.wheel_state import (
    RECORD_OVERHEAD,
    UNBOUNDED,
    Outcomes,
    WheelState,
)

log = logging.getLogger(__name__)

LOAD_BYTES_PER_S: Final = 10_000_000
"""A slot file is read this many bytes per second ahead of the look-ahead, so a burst
due in one second (one big slot) is in memory before it is due; decoding runs at about
three times this on a 2-core host."""
MAX_LEAD_S: Final = 60.0
"""At most this far beyond the look-ahead does a slot's size move its load earlier."""
MARKS_EVERY_S: Final = 0.05
"""How often settled marks are written to their slot files, in one write per slot."""
LOAD_AT_MOST: Final = 5_000
"""Records read into memory per step of a slot's loading."""
FILL_SLICE_S: Final = 0.1
"""At most this long reading records in at a time, so settled marks keep being written."""


class SlotLoading:
    def __init__(
        self, state: WheelState, cancels: CancelLog, outcomes: Outcomes, takeover_s: float
    ) -> None:
        self._state = state
        self._cancels = cancels
        self._outcomes = outcomes
        self._takeover_s = takeover_s

    def _next_to_load(self) -> tuple[int, int] | float | None:
        """The slot to load now, else seconds until one is due to be (None: none on
        disk). A slot loads `lookahead` before its second, and earlier by its size, but
        not while a span that may hold more of its records waits to be split."""
        state = self._state
        now = state.clock()
        horizon = now + state.lookahead_s
        while state.unloaded and state.unloaded[0][0] <= horizon + MAX_LEAD_S:
            state.near.append(heapq.heappop(state.unloaded))
        wait: float | None = None
        for index, (second, partition) in enumerate(state.near):
            if second >= state.span_floor.get(partition, UNBOUNDED):
                wait = MARKS_EVERY_S if wait is None else min(wait, MARKS_EVERY_S)
                continue  # its span is being split: asked again shortly
            size = state.store.size(partition, second) or 0
            start = second - state.lookahead_s - min(MAX_LEAD_S, size / LOAD_BYTES_PER_S)
            if start <= now:
                return state.near.pop(index)
            wait = start - now if wait is None else min(wait, start - now)
        if state.unloaded:
            head = state.unloaded[0][0] - horizon - MAX_LEAD_S
            wait = head if wait is None else min(wait, head)
        return wait

    def load_due_slots(self) -> float | None:
        """Index every slot that is due to be loaded, and bring records of the slots
        being loaded into memory while the budget allows; seconds until the next slot
        is due to be (None: none on disk)."""
        state = self._state
        wait: float | None = None
        while not state.stopping.is_set():
            with state.lock:
                chosen = self._next_to_load()
                if not isinstance(chosen, tuple):
                    wait = chosen
                    break
                second, partition = chosen
                # From here on appends to the slot go to memory by the intake; the
                # file's size now marks what the index below covers.
                tracker = SlotTracker(partition, second, FileOffsets())
                state.trackers[(partition, second)] = tracker
                tracker.loading = True
                size = state.store.size(partition, second) or 0
            index = SlotIndex(
                functools.partial(state.store.read_at, (partition, second, 1)),
                size,
                second,
                int(self._takeover_s * 1000),
            )
            offsets = index.offsets()
            with state.lock:
                assert tracker.on_file is not None
                index.drop(tracker.on_file.indexed(offsets))  # held already: not again
                state.cost[tracker] = index.frame_bytes + RECORD_OVERHEAD
                state.loading[tracker] = index
                state.held += index.memory + tracker.on_file.memory
        return 0.0 if self.fill() else wait

    def fill(self) -> bool:
        """Bring records of the slots being loaded into memory, earliest slot first and
        in due order within it, while the records held stay under the budget; records
        already due are read even above it when the forwarder is about to run dry, so
        the wheel never stalls on its own memory (records in flight to their targets
        count until acknowledged). True: stopped after `FILL_SLICE_S` with more to read
        now."""
        state = self._state
        until = time.monotonic() + FILL_SLICE_S
        while state.loading and not state.stopping.is_set():
            if time.monotonic() >= until:
                return True
            tracker = min(state.loading, key=lambda t: t.second)
            index = state.loading[tracker]
            millisecond = index.next_millisecond()
            room = state.shared.room()
            cost = state.cost.get(tracker, RECORD_OVERHEAD)
            if millisecond is not None and room < cost:
                due = tracker.second * 1000 + millisecond <= state.clock() * 1000
                if not due or state.buffered() >= LOAD_AT_MOST:
                    return False  # over budget: wait for records to leave
                room = cost * LOAD_AT_MOST // 10  # the forwarder would run dry
            count = min(LOAD_AT_MOST, max(1, room // cost))
            stored = index.take(count) if millisecond is not None else []
            records, cancelled = self._admit_loaded(tracker, stored, finished=not index)
            if cancelled:
                self._outcomes.cancelled("cancelled", cancelled)
            if records:
                state.schedule(records)
        return False

    def _admit_loaded(
        self, tracker: SlotTracker, stored: list[StoredRecord], finished: bool
    ) -> tuple[list[tuple[SlotRecord, float]], int]:
        """Records read from a slot, as the forwarder's buffer takes them; drops the
        cancelled (a settled mark each). With the last of the slot, it stops loading."""
        state = self._state
        partition, second = tracker.partition, tracker.second
        takeover = self._takeover_s
        # Built outside the lock, which the forwarder takes before every send.
        out = [
            (
                SlotRecord.stored(item, partition, tracker),
                item.due_ms / 1000 + (takeover if item.replica else 0.0),
            )
            for item in stored
        ]
        cancelled = 0
        with state.lock:
            stale = state.reschedules.superseded(
                (item.message_id, item.offset, item.copy) for item in stored
            )
            if stale:  # moved: settled unsent, and no cancel of theirs is matched by it
                kept = []
                kept_stored = []
                for item, held in zip(stored, out, strict=True):
                    if (item.message_id, item.offset) in stale:
                        state.marks.setdefault(tracker, []).append(item.offset)
                    else:
                        kept.append(held)
                        kept_stored.append(item)
                out, stored = kept, kept_stored
            called_off = self._cancels.among(item.message_id for item in stored)
            if called_off:
                kept = []
                for item, held in zip(stored, out, strict=True):
                    if item.message_id in called_off:
                        state.matches.setdefault(tracker, []).append(item.message_id)
                        state.marks.setdefault(tracker, []).append(item.offset)
                        cancelled += 1
                    else:
                        kept.append(held)
                out = kept
            state.in_memory.update(record.envelope.id for record, _ in out if record.envelope)
            cost = state.cost.get(tracker, RECORD_OVERHEAD)
            tracker.outstanding += len(out)
            state.held += cost * len(out)
            if finished:
                index = state.loading.pop(tracker, None)
                if index is not None:
                    state.held -= index.memory
                tracker.loading = False
                if state.finished(tracker):
                    state.delete(tracker)
                log.debug("loaded slot %d of partition %d", second, partition)
        return out, cancelled
