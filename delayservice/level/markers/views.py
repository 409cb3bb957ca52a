"""What the marker book shows of its slots as the containers it used to keep (the
forwarders' screen, the entries by answer key, the moves carried out, the final states),
made when asked for: nothing here holds a marker. The views know the book only by the
calls below (`Book`), so the book can import them and they need not import it."""

from __future__ import annotations

from typing import Protocol

from delayservice.forward.buffer import TP
from delayservice.level.markers.entry import Entry


class Book(Protocol):
    """The calls of `book.MarkerBook` the views are made of."""

    def watched(self, tp: TP) -> bool: ...
    def watch_dict(self) -> dict[TP, set[bytes]]: ...
    def names(self, raw_id: bytes, tp: TP) -> bool: ...
    def named(self, tp: TP, raw_ids: list[bytes]) -> list[int]: ...
    def entry(self, key: bytes) -> Entry | None: ...
    def all_entries(self) -> list[Entry]: ...
    def kept_count(self) -> int: ...
    def is_executed(self, key: bytes) -> bool: ...
    def final_of(self, message_id: str) -> str | None: ...


class Watch:
    """Level partition -> the ids (as records carry them) a marker kept names there:
    `watch.get(tp)` is None when none does, else a container to screen records with."""

    def __init__(self, book: Book) -> None:
        self._book = book

    def get(self, tp: TP) -> Watching | None:
        return Watching(self._book, tp) if self._book.watched(tp) else None

    def as_dict(self) -> dict[TP, set[bytes]]:
        return self._book.watch_dict()

    def __eq__(self, other: object) -> bool:
        return self.as_dict() == other

    __hash__ = None  # type: ignore[assignment]


class Watching:
    __slots__ = ("_book", "_tp")

    def __init__(self, book: Book, tp: TP) -> None:
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

    def __init__(self, book: Book) -> None:
        self._book = book

    def get(self, key: bytes) -> Entry | None:
        return self._book.entry(key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes) and self.get(key) is not None

    def __len__(self) -> int:
        return self._book.kept_count()

    def values(self) -> list[Entry]:
        return self._book.all_entries()


class Executed:
    """The answer keys of the reschedules carried out (their copy exists)."""

    def __init__(self, book: Book) -> None:
        self._book = book

    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes) and self._book.is_executed(key)


class FinalStates:
    """Id -> its message's final state (cancelled, forwarded), if done for good."""

    def __init__(self, book: Book) -> None:
        self._book = book

    def get(self, message_id: str) -> str | None:
        return self._book.final_of(message_id)
