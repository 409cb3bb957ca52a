"""A durable set of cancelled message ids.

A cancel arrives as a record and may name a message that is still hours from due,
so it has to outlive restarts: it stays until the message it names is removed
(`matched`) or until it can no longer match anything (`expire`). A cancel names a
message due at most `max_delay` after the cancel was appended, so the caller passes
that instant as the expiry. The file (`id_log`) holds one line per change:

    + {expires_ms} {hex of the id's UTF-8}
    - {hex of the id's UTF-8}
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from pathlib import Path

from delayservice.precise.storage.id_log import COMPACT_MIN_DEAD, IdLog, IdLogError, read_entries
from delayservice.precise.storage.storage_fault import StorageError, ignore, reported

__all__ = ["COMPACT_MIN_DEAD", "CancelLog", "CancelLogError", "pending_cancels"]


class CancelLogError(IdLogError):
    """The cancel file could not be read or written; the message names the path."""


def pending_cancels(path: Path) -> set[str]:
    """The ids a cancel file holds, read without changing it (for a census beside a
    running daemon, which owns the file)."""
    return set(read_entries(path, CancelLog.width))


class CancelLog(IdLog):
    width = 1
    error = CancelLogError
    noun = "cancels"

    def __init__(
        self,
        path: Path,
        max_entries: int = 1_000_000,
        on_fault: Callable[[StorageError], None] = ignore,
    ) -> None:
        """No clock here: expired entries stay until the first `expire`."""
        super().__init__(path, max_entries, on_fault)
        self._heap = [(values[0], message_id) for message_id, values in self._entries.items()]
        heapq.heapify(self._heap)  # (expires_ms, id), stale rows skipped

    @reported
    def add(self, message_id: str, expires_ms: int) -> bool:
        """Remember a cancel. False, storing nothing, when the log is full."""
        with self._lock:
            known = self._entries.get(message_id)
            if known is not None and known[0] >= expires_ms:
                return True  # a redelivered cancel: nothing new to store
            if not self._put(message_id, (expires_ms,)):
                return False
            heapq.heappush(self._heap, (expires_ms, message_id))
            return True

    @reported
    def matched(self, message_id: str) -> None:
        """The cancel removed its message and can never be needed again."""
        with self._lock:
            self._drop([message_id])

    @reported
    def expire(self, now_ms: int) -> list[str]:
        """Drop and return the cancels whose expiry is before `now_ms`.

        Strictly before: a message due exactly at the expiry may still be firing.
        """
        with self._lock:
            gone: list[str] = []
            while self._heap and self._heap[0][0] < now_ms:
                expires, message_id = heapq.heappop(self._heap)
                known = self._entries.get(message_id)
                if known is not None and known[0] == expires:
                    gone.append(message_id)
            self._drop(gone)
            if len(self._heap) > 2 * len(self._entries) + 1024:  # drop stale rows
                self._heap = [(values[0], mid) for mid, values in self._entries.items()]
                heapq.heapify(self._heap)
            return gone

    @reported
    def sync(self) -> None:
        """Make every add and removal so far durable, then compact the file if it is
        mostly dead lines."""
        self._sync()
