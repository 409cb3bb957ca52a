"""Where each id's latest copy is, as the answers of its moves said: the owner of the
partition a copy was written to answers the markers of its id (`on`).

Apart from the marker book's columns because a copy outlives the markers that made it
only while one of its id is kept, and is looked up by id and by partition, not by slot.
"""

from __future__ import annotations

from delayservice.forward.buffer import TP


class Copies:
    __slots__ = ("_by_tp", "latest")

    def __init__(self) -> None:
        self.latest: dict[str, TP] = {}
        """Id -> where its latest copy was written, per the answer of the move."""
        self._by_tp: dict[TP, set[str]] = {}

    def __len__(self) -> int:
        return len(self.latest)

    def note(self, message_id: str, where: TP | None) -> None:
        """Note where an id's latest copy is (None: nowhere known)."""
        old = self.latest.pop(message_id, None)
        if old is not None:
            ids = self._by_tp.get(old)
            if ids is not None:
                ids.discard(message_id)
                if not ids:
                    del self._by_tp[old]
        if where is not None:
            self.latest[message_id] = where
            self._by_tp.setdefault(where, set()).add(message_id)

    def take_back(self, message_id: str, where: TP) -> None:
        """A move to `where` did not commit: its copy is nowhere known, unless a later
        one is."""
        if self.latest.get(message_id) == where:
            self.note(message_id, None)

    def on(self, tp: TP) -> set[str]:
        """Ids whose latest copy was written to `tp` (its owner answers their markers)."""
        return set(self._by_tp.get(tp, ()))
