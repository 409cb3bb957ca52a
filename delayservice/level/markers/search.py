"""How far a worker has looked through each owned partition's queue for the messages of
its markers, and how far that partition's reading has got.

A marker's message is searched for in the queue once, then only among the records
admitted since (`search`); a marker parked because its message was not queued comes
back when a record of its id is read (`unpark_arrivals`); a message not found is
answered as never sent only once the partition's reading is past its due time
(`passed`). Apart from the worker's markers because this is what they remember of the
queues, not of the markers: it starts over whenever a queue does (`forget`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from delayservice.forward.buffer import TP
from delayservice.forward.held_record import offset_of
from delayservice.level.markers.book import MarkerBook
from delayservice.level.markers.entry import Entry
from delayservice.level.markers.records import id_of

EMPTY_GRACE_MS: Final = 5_000


class QueueSearch:
    def __init__(self, book: MarkerBook) -> None:
        self._book = book
        self._scanned: dict[TP, tuple[int, set[bytes]]] = {}
        """Partition -> (offset through which its queue was searched, for which ids)."""
        self._arrivals: dict[TP, int] = {}
        """Per partition with parked markers: the last offset looked at for their messages."""
        self._read: dict[TP, tuple[int, int]] = {}
        """Partition -> (the latest append time of a run handed over since it was
        assigned, when that run was handed over): how far its reading got."""

    def read(self, tp: TP, appended_ms: int, now_ms: int) -> None:
        """A run appended up to `appended_ms` was handed over at `now_ms`."""
        read = self._read.get(tp)
        self._read[tp] = (max(appended_ms, read[0] if read else appended_ms), now_ms)

    def forget(self, tp: TP) -> None:
        """The partition's queue starts over."""
        self._scanned.pop(tp, None)
        self._read.pop(tp, None)
        self._arrivals.pop(tp, None)

    def again(self, tp: TP | None = None) -> None:
        """Search the queue of `tp` (None: of every partition) whole again."""
        if tp is None:
            self._scanned.clear()
        else:
            self._scanned.pop(tp, None)

    def parked(self, tp: TP) -> None:
        """Markers of `tp` were parked: records admitted after the search bring theirs back."""
        self._arrivals.setdefault(tp, self._scanned.get(tp, (-1, set()))[0])

    def unpark_arrivals(self, tp: TP, queue: Sequence[Any] | None) -> None:
        """Records read on `tp` since its markers were parked bring theirs back (a
        parked marker's message was not queued when it was searched for)."""
        if not self._book.parked_on(tp):
            self._arrivals.pop(tp, None)
            return
        through = self._arrivals.get(tp)
        if through is None or not queue:
            return
        raw_ids = []
        last = through
        for record in reversed(queue):
            offset = offset_of(record)
            if offset <= through:
                break
            last = max(last, offset)
            message_id = id_of(record)
            if message_id is not None:
                raw_ids.append(message_id.encode())
        if raw_ids:
            self._book.unpark_named(tp, raw_ids)
        self._arrivals[tp] = last

    def search(
        self, tp: TP, queue: Sequence[Any] | None, entries: list[Entry], copies: set[str]
    ) -> dict[str, Any]:
        """The queued records of `tp` that these markers (or copies) may concern: a
        marker not searched for yet searches the whole queue once, then only records
        admitted since are looked at."""
        if not queue:
            return {}
        through, searched = self._scanned.get(tp, (-1, set()))
        wanted = {e.marker.message_id for e in entries} | copies
        fresh = {e.marker.message_id for e in entries if e.marker.key not in searched}
        fresh |= {c for c in copies if c.encode() not in searched}
        found: dict[str, Any] = {}
        last = through
        for record in reversed(queue):
            offset = offset_of(record)
            last = max(last, offset)
            if offset <= through and not fresh:
                break
            message_id = id_of(record)
            if message_id in wanted and (offset > through or message_id in fresh):
                found.setdefault(message_id, record)
        keys = {e.marker.key for e in entries} | {c.encode() for c in copies}
        self._scanned[tp] = (last, keys)
        return found

    def passed(
        self,
        tp: TP,
        queue: Sequence[Any] | None,
        due_of: Callable[[TP, Any], int],
        bound: int,
        delay_ms: int,
        now: int,
        assigned_ms: int,
    ) -> bool:
        """Whether the partition's reading is past `bound` (a due time): its head is due
        later, or a run appended after `bound` less the delay was handed over. With an
        empty queue and nothing read that far, only a partition that has handed over
        nothing for a while since it was assigned (at `assigned_ms`) counts as idle:
        right after an assignment (a restart, a rebalance) or behind a backlog the
        consumer may not have handed over the records up to the message yet, and a
        message not read yet must not be answered as one that never came."""
        if queue:
            return due_of(tp, queue[0]) > bound
        read = self._read.get(tp)
        if read is not None and read[0] > bound - delay_ms:
            return True
        quiet_since = max(assigned_ms, read[1] if read is not None else 0)
        return now >= bound + EMPTY_GRACE_MS and now - quiet_since >= EMPTY_GRACE_MS
