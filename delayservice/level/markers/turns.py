"""The owners' turns over each level partition's markers not answered yet: which of
them `entries` serves next (a flood a batch at a time, round all of it), and which are
parked until a time because nothing can be decided about them before it.

Apart from the marker book because it is an index of slots, not a store: the book keeps
the markers and their flags in its columns, and starts a fresh `Turns` with each columns
object (slots renumber when the book compacts, so parking starts over).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator

from delayservice.level.markers import store as st
from delayservice.level.markers.entry import Entry


class Turns:
    __slots__ = ("_cols", "_cursors", "_parked", "_parked_n", "_unresolved", "_unresolved_n")

    def __init__(self, cols: st.Columns) -> None:
        self._cols = cols
        self._unresolved: dict[int, array[int]] = {}
        """Level partition -> its slots not answered yet (and some answered since)."""
        self._unresolved_n: dict[int, int] = {}
        self._cursors: dict[int, int] = {}
        """Level partition -> where in its unresolved slots `pick` goes on from."""
        self._parked: dict[int, dict[int, array[int]]] = {}
        """Level partition -> second -> its slots parked until then (8 bytes each)."""
        self._parked_n: dict[int, int] = {}

    def unresolve(self, slot: int, t: int) -> None:
        """`slot` (of level partition `t`) waits for an answer."""
        slots = self._unresolved.get(t)
        if slots is None:  # not `setdefault`: it would make an array for every marker
            slots = self._unresolved[t] = array_q()
        slots.append(slot)
        self._unresolved_n[t] = self._unresolved_n.get(t, 0) + 1

    def answered(self, slot: int) -> None:
        """`slot` is answered (before the book notes its answer): out of its turn."""
        cols = self._cols
        i = slot - cols.base
        if cols.answer[i] == 0:
            self._unresolved_n[cols.tp[i]] -= 1
        self.unpark(slot, requeue=False)

    def forgotten(self, slot: int) -> None:
        """`slot` is forgotten (before the book clears its flags): it counts no more."""
        cols = self._cols
        i = slot - cols.base
        t = cols.tp[i]
        if cols.flags[i] & st.PARKED:
            self._parked_n[t] -= 1
        if cols.answer[i] == 0:
            self._unresolved_n[t] -= 1

    def pick(self, t: int, limit: int | None, now_ms: int | None) -> Iterable[int]:
        """The slots of level partition `t` to serve now (`MarkerBook.entries`)."""
        if now_ms is not None:
            self._unpark_due(t, now_ms)
        n = self._unresolved_n.get(t, 0) - self._parked_n.get(t, 0)
        if not n:
            if not self._parked_n.get(t):
                self._unresolved.pop(t, None)
                self._cursors.pop(t, None)
            return ()
        slots = self._unresolved.get(t, array_q())
        if len(slots) > 2 * n + 64:  # mostly answered, forgotten or parked: drop those
            slots = self._unresolved[t] = array_q(self._pending(slots))
            self._cursors.pop(t, None)
        if limit is None or limit >= n:
            return self._pending(slots)
        cols = self._cols
        size = len(slots)
        at = self._cursors.get(t, 0) % size
        picked: dict[int, None] = {}
        for _ in range(size):
            slot = slots[at]
            at = (at + 1) % size
            if slot >= cols.base and slot not in picked:
                i = slot - cols.base
                if cols.flags[i] & (st.LIVE | st.PARKED) == st.LIVE and cols.answer[i] == 0:
                    picked[slot] = None
                    if len(picked) >= limit:
                        break
        self._cursors[t] = at
        return picked

    def _pending(self, slots: array[int]) -> Iterator[int]:
        """The live, unanswered slots among `slots`, once each."""
        cols = self._cols
        base = cols.base
        seen: set[int] = set()
        for slot in slots:
            if slot in seen or slot < base:
                continue
            i = slot - base
            if cols.flags[i] & (st.LIVE | st.PARKED) == st.LIVE and cols.answer[i] == 0:
                seen.add(slot)
                yield slot

    def park(
        self, t: int, until: list[tuple[Entry, int]], final_of: Callable[[str], str | None]
    ) -> list[tuple[Entry, str]]:
        """`MarkerBook.park` on level partition `t` (`final_of`: the book's)."""
        done: list[tuple[Entry, str]] = []
        cols = self._cols
        buckets = self._parked.setdefault(t, {})
        for entry, until_ms in until:
            i = entry.slot - cols.base
            if (
                i < 0
                or i >= len(cols)
                or cols.flags[i] & (st.LIVE | st.PARKED) != st.LIVE
                or cols.answer[i]
                or cols.tp[i] != t
            ):
                continue
            final = final_of(entry.marker.message_id)
            if final is not None:
                done.append((entry, final))
                continue
            cols.flags[i] |= st.PARKED
            self._parked_n[t] = self._parked_n.get(t, 0) + 1
            second = -(-until_ms // 1000)  # rounded up: never back early
            buckets.setdefault(second, array_q()).append(entry.slot)
        return done

    def parked_on(self, t: int) -> int:
        return self._parked_n.get(t, 0)

    def has_unresolved(self, t: int) -> bool:
        return self._unresolved_n.get(t, 0) > 0

    def unpark_all(self, t: int) -> None:
        if self._parked_n.get(t):
            for slots in self._parked.pop(t, {}).values():
                for slot in slots:
                    self.unpark(slot)

    def _unpark_due(self, t: int, now_ms: int) -> None:
        buckets = self._parked.get(t)
        if buckets is None:
            return
        for second in [s for s in buckets if s * 1000 <= now_ms]:
            for slot in buckets.pop(second):
                self.unpark(slot)
        if not buckets:
            del self._parked[t]

    def unpark(self, slot: int, *, requeue: bool = True) -> None:
        """`slot` back in its partition's turn (`requeue`), if it is still parked; its
        entry in a second's bucket, if any, is passed over when that second comes."""
        cols = self._cols
        if slot < cols.base or not cols.flags[slot - cols.base] & st.PARKED:
            return
        i = slot - cols.base
        cols.flags[i] &= ~st.PARKED
        t = cols.tp[i]
        self._parked_n[t] -= 1
        if requeue:
            self._unresolved.setdefault(t, array_q()).append(slot)

    def nbytes(self) -> int:
        """What the slots in turn and the parked ones take (8 bytes each)."""
        unresolved = sum(len(a) * 8 for a in self._unresolved.values())
        return unresolved + sum(len(a) * 8 for b in self._parked.values() for a in b.values())


def array_q(items: Iterable[int] = ()) -> array[int]:
    return array("q", items)
