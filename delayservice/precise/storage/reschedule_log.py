"""The durable record of which copy of a rescheduled message is the live one.

A reschedule does not edit the file that holds its message: every slot and span file
is only appended to or deleted whole. It appends a copy of the message, due at the new
time, to the file of that time, with the reschedule marker's own offset on the precise
topic as the copy's offset. This log says, per message id, which copy is live: the one
whose offset is the entry's `version`. Every other copy of the id, wherever it sits
(earlier or later, on disk or already in memory, or read again after a crash), is
settled without being sent when it comes up. One line per change (`id_log`):

    + {due_ms} {version} {hold_ms} {partition} {hex of the id's UTF-8}
    - {hex of the id's UTF-8}

`hold_ms` is the latest time any copy of the id fires. An entry is needed while some
file of its partition may still hold a copy, so it goes once the partition's earliest
file starts after `hold_ms` (`expire`): files are deleted only when every record in
them is settled.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from delayservice.precise.storage.id_log import IdLog, IdLogError, read_entries
from delayservice.precise.storage.storage_fault import reported


class RescheduleLogError(IdLogError):
    """The reschedule file could not be read or written; the message names the path."""


class Move(NamedTuple):
    due_ms: int
    version: int
    """The offset of the live copy: the last reschedule marker that moved the message."""
    hold_ms: int
    partition: int


def pending_moves(path: Path) -> dict[str, Move]:
    """The live entries of a reschedule file, read without changing it (for a census
    beside a running daemon, which owns the file)."""
    return {m: Move(*v) for m, v in read_entries(path, RescheduleLog.width).items()}


class RescheduleLog(IdLog):
    width = 4
    error = RescheduleLogError
    noun = "reschedules"

    def current(self, message_id: str) -> Move | None:
        with self._lock:
            values = self._entries.get(message_id)
            return None if values is None else Move(*values)

    @reported
    def move(self, message_id: str, move: Move) -> bool:
        """Make `move` the live copy of `message_id`. False, storing nothing, when the
        log is full."""
        with self._lock:
            return self._put(message_id, tuple(move))

    def has_room(self, message_id: str) -> bool:
        """Whether a move of `message_id` can be stored now."""
        with self._lock:
            return message_id in self._entries or len(self._entries) < self._max_entries

    def superseded(self, records: Iterable[tuple[str, int, bool]]) -> set[tuple[str, int]]:
        """Which of (id, offset, is a reschedule's copy) are not their id's live copy,
        as (id, offset), under one hold of the lock. With an entry only the copy at its
        `version` is live; without one, only the message as first stored (a copy no
        entry names was written by a move that did not complete)."""
        with self._lock:
            entries = self._entries
            out: set[tuple[str, int]] = set()
            for message_id, offset, copy in records:
                values = entries.get(message_id) if entries else None
                if (values[1] != offset) if values is not None else copy:
                    out.add((message_id, offset))
            return out

    @reported
    def expire(self, earliest_s: dict[int, int]) -> int:
        """Drop the entries no file can hold a copy of any more: their partition's
        earliest file (`earliest_s`, partition -> first second; a partition with no
        files is absent) starts after every copy's time. Returns how many went."""
        with self._lock:
            gone = [
                message_id
                for message_id, (_, _, hold_ms, partition) in self._entries.items()
                if hold_ms // 1000 < earliest_s.get(partition, hold_ms // 1000 + 1)
            ]
            self._drop(gone)
            return len(gone)

    @reported
    def sync(self) -> None:
        """Make every move and removal so far durable."""
        self._sync()
