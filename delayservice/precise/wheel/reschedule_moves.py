"""Moving messages for reschedules.

A reschedule does not edit the file that holds its message: every slot and span file
is only appended to or deleted whole. It appends a copy of the message, due at the new
time, to the file of that time, and names that copy live in the reschedule log
(`reschedule_log`); every other copy is settled unsent when it comes up. The copies
are found by a search of the partition's files (`copy_finder`), since nothing on disk
is indexed by id.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from delayservice.precise.storage.cancel_log import CancelLog
from delayservice.precise.storage.copy_finder import find_copies
from delayservice.precise.storage.reschedule_log import Move
from delayservice.precise.storage.slot_file import StoredRecord, encode
from delayservice.precise.storage.slot_record import SlotRecord
from delayservice.precise.storage.slot_store import Key
from delayservice.precise.wheel.slot_ledger import SlotTracker
from delayservice.precise.wheel.wheel_state import WheelState

READ_AGAIN: Final = "read_again"
"""A reschedule marker read again after a restart: it, or a later marker, moved the
message already."""
FIND_TRIES: Final = 3
"""Searches for a reschedule's copies outside the wheel's lock before one holding it."""


class Reschedule(NamedTuple):
    """A reschedule marker as the intake read it."""

    message_id: str
    partition: int
    version: int  # the marker's offset: the offset its copy gets
    due_ms: int
    replica: bool  # this member holds the partition's replica
    fire_ms: int  # due_ms, plus the takeover delay for a replica's copy


def _moved_meanwhile(before: list[tuple[Key, int]], now: list[tuple[Key, int]]) -> bool:
    """Whether records may have reached files a search of `before` did not read: a file
    appeared, or a span went (split into finer files)."""
    old = {key for key, _ in before}
    current = {key for key, _ in now}
    return bool(current - old) or any(key[2] != 1 for key in old - current)


class RescheduleMoves:
    def __init__(self, state: WheelState, cancels: CancelLog, takeover_s: float) -> None:
        self._state = state
        self._cancels = cancels
        self._takeover_s = takeover_s

    def move_many(self, requests: list[Reschedule]) -> list[tuple[str, SlotRecord | None]]:
        """Move pending messages to new due times: per request, its outcome ("moved",
        "too_late", "unmatched", "cancelled", "refused", or `READ_AGAIN` for a marker
        whose move, or a later one's, is done already) and the copy when it belongs in
        memory now (the caller buffers it, through `admit`, once its offset is
        committed).

        Each move writes a copy of the message due at the new time and then names it
        live in the reschedule log; the copies are synced before the log entries are
        written, and the entries before this returns, all under the wheel's lock. So no
        crash can leave an entry whose copy is not on disk (the message would be lost),
        and no old copy is taken for sending or settled as stale until its replacement
        is live. A crash before the entries leaves copies no entry names, which are
        never sent, and the marker is read again. Cancels win: a cancelled id is not
        moved, and a cancel after the move calls off the live copy.

        Holding the lock across the syncs delays the forwarder by one sync per batch
        that holds reschedules; a reschedule is rare next to what it moves."""
        state = self._state
        wanted: dict[int, set[str]] = {}
        for request in requests:
            wanted.setdefault(request.partition, set()).add(request.message_id)
        found = self._find_locked_after(wanted)  # returns with the lock held
        try:
            out: list[tuple[str, SlotRecord | None]] = []
            moves: dict[str, Move] = {}  # this batch's entries, the last per id
            for request in requests:
                copies = found.setdefault((request.partition, request.message_id), [])
                outcome, stored, tracker = self._move_locked(request, copies, moves)
                held = None
                if stored is not None:
                    copies.append(stored)  # a later marker of the id in this batch moves it
                    if tracker is not None:
                        held = SlotRecord.stored(stored, request.partition, tracker)
                out.append((outcome, held))
            if moves:
                state.store.sync()  # the copies first: an entry must never name a lost copy
                for message_id, move in moves.items():
                    state.reschedules.move(message_id, move)
                state.reschedules.sync()
            return out
        finally:
            state.lock.release()

    def _find_locked_after(
        self, wanted: dict[int, set[str]]
    ) -> dict[tuple[int, str], list[StoredRecord]]:
        """The stored copies of the ids wanted, per (partition, id); returns holding the
        wheel's lock. The files are read outside the lock, which is then taken and the
        search repeated if a file appeared or a span went meanwhile (a split moved
        records into finer files); after `FIND_TRIES` such tries, it searches holding
        the lock. Slots that went are harmless: every record in them was settled."""
        state = self._state
        for attempt in range(FIND_TRIES + 1):
            last = attempt == FIND_TRIES
            if last:
                state.lock.acquire()
            snapshot = {partition: state.store.files(partition) for partition in wanted}
            found: dict[tuple[int, str], list[StoredRecord]] = {}
            for partition, ids in wanted.items():
                copies = find_copies(snapshot[partition], state.store.read_at, ids)
                for message_id, stored in copies.items():
                    found[(partition, message_id)] = stored
            if last:
                return found
            state.lock.acquire()
            if not any(
                _moved_meanwhile(snapshot[partition], state.store.files(partition))
                for partition in wanted
            ):
                return found
            state.lock.release()
        raise AssertionError("unreachable")  # pragma: no cover

    def _move_locked(
        self, request: Reschedule, copies: list[StoredRecord], moves: dict[str, Move]
    ) -> tuple[str, StoredRecord | None, SlotTracker | None]:
        """One move's decision and its copy's write (lock held): the outcome, the copy
        as stored and its slot's tracker when the slot is in memory. The log entry
        goes into `moves`, to be written once the copies are durable."""
        state = self._state
        message_id = request.message_id
        if message_id in self._cancels or message_id in state.called_off:
            return "cancelled", None, None
        if message_id in state.recent:
            return "too_late", None, None
        current = moves.get(message_id) or state.reschedules.current(message_id)
        if current is not None and current.version >= request.version:
            return READ_AGAIN, None, None  # after a restart: this marker, or a later one, moved it
        # The live copy: the entry's, else the message as first stored. Its settled
        # mark, or its file gone, means it was sent (the search skips both).
        live = [
            copy
            for copy in copies
            if (copy.offset == current.version if current is not None else not copy.copy)
        ]
        if not live:
            return "unmatched", None, None
        if not state.reschedules.has_room(message_id):
            return "refused", None, None
        stored = live[0]._replace(
            offset=request.version, due_ms=request.due_ms, replica=request.replica, copy=True
        )
        (tracker,) = state.append_locked([(request.partition, request.fire_ms, encode(stored))])
        takeover_ms = int(self._takeover_s * 1000)
        hold_ms = max(
            request.fire_ms,
            current.hold_ms if current is not None else 0,
            *(copy.due_ms + (takeover_ms if copy.replica else 0) for copy in copies),
        )
        moves[message_id] = Move(request.due_ms, request.version, hold_ms, request.partition)
        return "moved", stored, tracker
