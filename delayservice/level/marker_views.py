"""What the marker book shows of its slots as the containers it used to keep (the
forwarders' screen, the entries by answer key, the moves carried out, the final states),
made when asked for: nothing here holds a marker."""

from __future__ import annotations

from typing import TYPE_CHECKING

from delayservice.forward.buffer import TP

if TYPE_CHECKING:
    from delayservice.level.marker_book import Entry, MarkerBook


class Watch:
    """Level partition -> the ids (as records carry them) a marker kept names there:
    `watch.get(tp)` is None when none does, else a container to screen records with."""

    def __init__(self, book: MarkerBook) -> None:
        self._book = book

    def get(self, tp: TP) -> Watching | None:
        t = self._book._tps.get(tp)
        if t is None or not self._book._watch_n.get(t):
            return None
        return Watching(self._book, tp)

    def as_dict(self) -> dict[TP, set[bytes]]:
        book = self._book
        with book._lock:
            out: dict[TP, set[bytes]] = {}
            for slot in book.live_slots():
                if book._cols.refusal[slot - book._cols.base] < 0:
                    entry = book._entry_of(slot)
                    out.setdefault(entry.tp, set()).add(entry.marker.message_id.encode())
            return out

    def __eq__(self, other: object) -> bool:
        return self.as_dict() == other

    __hash__ = None  # type: ignore[assignment]


class Watching:
    __slots__ = ("_book", "_tp")

    def __init__(self, book: MarkerBook, tp: TP) -> None:
        self._book = book
        self._tp = tp

    def __contains__(self, raw_id: object) -> bool:
        return isinstance(raw_id, bytes) and self._book.names(raw_id, self._tp)

    def __bool__(self) -> bool:
        return True

    def positions(self, raw_ids: list[bytes]) -> list[int]:
        return self._book.named(self._tp, raw_ids)


class Keys:
    """Answer key -> the marker's entry (made when asked for)."""

    def __init__(self, book: MarkerBook) -> None:
        self._book = book

    def get(self, key: bytes) -> Entry | None:
        with self._book._lock:
            slot = self._book._slot(key)
            return None if slot < 0 else self._book._entry_of(slot)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes) and self.get(key) is not None

    def __len__(self) -> int:
        return sum(self._book._kept.values())

    def values(self) -> list[Entry]:
        with self._book._lock:
            return [self._book._entry_of(s) for s in self._book.live_slots()]


class Executed:
    """The answer keys of the reschedules carried out (their copy exists)."""

    def __init__(self, book: MarkerBook) -> None:
        self._book = book

    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes) and self._book.is_executed(key)


class FinalStates:
    """Id -> its message's final state (cancelled, forwarded), if done for good."""

    def __init__(self, book: MarkerBook) -> None:
        self._book = book

    def get(self, message_id: str) -> str | None:
        return self._book.final_of(message_id)
