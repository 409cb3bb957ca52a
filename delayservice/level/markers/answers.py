"""What the marker book notes of the answers to its markers: those read back from the
outcomes topic (committed), those a forwarder gave in its open interval (`Action`, taken
back when the interval does not commit), the moves carried out and the final states of
messages; and the table of the distinct outcomes the answer column keeps as codes.

Apart from the book because it is one job done over the book's keepers, not a store of
its own: it writes the slots' answers and flags, or the orphans for a marker not kept,
and the copies. The book keeps the lock (every call here runs under it) and hands over
its fresh slots each time it compacts (`slots`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from delayservice.forward.buffer import TP
from delayservice.level.markers import store as st
from delayservice.level.markers.copies import Copies
from delayservice.level.markers.orphans import OrphanAnswers
from delayservice.level.markers.slots import Slots, final_flag
from delayservice.markers.replies import CANCEL, CANCELLED, RESCHEDULE, MarkerReply

FORWARDED: Final = "forwarded"


@dataclass
class Action:
    """What one forwarder decided about markers in its open interval; confirmed when
    the interval commits, taken back when it does not."""

    answers: list[tuple[bytes, str]] = field(default_factory=list)
    executed: list[bytes] = field(default_factory=list)
    final: list[tuple[str, str]] = field(default_factory=list)
    copies: list[tuple[str, TP]] = field(default_factory=list)


class Answers:
    __slots__ = ("_copies", "_orphans", "_outcome_codes", "_outcome_names", "slots")

    def __init__(self, slots: Slots, orphans: OrphanAnswers, copies: Copies) -> None:
        self.slots = slots
        """The book's slots (the book sets the fresh ones when it compacts)."""
        self._orphans = orphans
        self._copies = copies
        self._outcome_codes: dict[str, int] = {}
        self._outcome_names: list[str] = ["<none>"]

    def outcome(self, outcome: str) -> int:
        return st.code(self._outcome_codes, self._outcome_names, outcome)

    def codes(self, outcomes: Iterable[str]) -> set[int | None]:
        """The codes of those of `outcomes` given so far."""
        return {self._outcome_codes.get(o) for o in outcomes} - {None}

    def read(self, key: bytes, reply: MarkerReply, written_ms: int) -> bool:
        """An answer read back (`MarkerBook.answer_read`); returns whether it fits its
        marker (one that does not is not noted)."""
        self.slots.latest_ms = max(self.slots.latest_ms, written_ms)
        slot = self.slots.slot_of(key)
        if slot < 0:
            self._orphans.read(key, written_ms)
        else:
            marker = self.slots.marker(slot)
            if marker.message_id != reply.message_id or marker.kind != reply.kind:
                return False
            self.slots.set_flags(slot, on=st.READ_BACK)
        self.answered(slot, key, reply.outcome, reply)
        if reply.kind == RESCHEDULE and reply.outcome == "moved" and reply.copy is not None:
            self._execute(slot, key)
            topic, _, partition = reply.copy.rpartition(":")
            if partition.isdigit():
                self._copies.note(reply.message_id, (topic, int(partition)))
        elif reply.kind == CANCEL and reply.outcome == CANCELLED:
            self._set_final(reply.message_id, CANCELLED)
        return True

    def answered(
        self, slot: int, key: bytes, outcome: str, reply: MarkerReply | None = None
    ) -> None:
        """Note an answer (`reply`: as read back; without one, a forwarder's, of which
        nothing is kept once its marker is forgotten)."""
        if slot < 0:
            self._orphans.answered(key, outcome, reply, self.slots.latest_ms)
            return
        self.slots.turns.answered(slot)
        self.slots.cols.answer[slot - self.slots.cols.base] = self.outcome(outcome)

    def _unanswered(self, slot: int, key: bytes) -> None:
        if slot < 0:
            self._orphans.unanswered(key)
            return
        cols = self.slots.cols
        i = slot - cols.base
        if cols.answer[i] != 0:
            cols.answer[i] = 0
            self.slots.turns.unresolve(slot, cols.tp[i])

    def _execute(self, slot: int, key: bytes) -> None:
        if slot < 0:
            self._orphans.execute(key, self.slots.latest_ms)
        else:
            self.slots.set_flags(slot, on=st.EXECUTED)

    def _set_final(self, message_id: str, state: str | None) -> None:
        head = self.slots.head(message_id)
        if head < 0:
            self._orphans.set_final(message_id, state, self.slots.latest_ms)
            return
        off = st.FINAL_CANCELLED | st.FINAL_OTHER
        self.slots.set_flags(head, on=0 if state is None else final_flag(state), off=off)
        if state is not None:  # its markers can be answered now
            for slot in self.slots.chain(head):
                self.slots.turns.unpark(slot)

    def final_of(self, message_id: str) -> str | None:
        head = self.slots.head(message_id)
        if head < 0:
            return self._orphans.final_of(message_id)
        flags = self.slots.flags(head)
        if flags & st.FINAL_CANCELLED:
            return CANCELLED
        return FORWARDED if flags & st.FINAL_OTHER else None

    def is_answered(self, key: bytes) -> bool:
        slot = self.slots.slot_of(key)
        if slot < 0:
            return key in self._orphans.answers
        return self.slots.cols.answer[slot - self.slots.cols.base] != 0

    def is_executed(self, key: bytes) -> bool:
        slot = self.slots.slot_of(key)
        if slot < 0:
            return key in self._orphans.executed
        return bool(self.slots.flags(slot) & st.EXECUTED)

    # -- what a forwarder decided ----------------------------------------------------
    def apply(self, action: Action) -> None:
        for key, outcome in action.answers:
            self.answered(self.slots.slot_of(key), key, outcome)
        for key in action.executed:
            self._execute(self.slots.slot_of(key), key)
        for message_id, state in action.final:
            self._set_final(message_id, state)
        for message_id, where in action.copies:
            self._copies.note(message_id, where)

    def take_back(self, action: Action) -> None:
        for key, _ in action.answers:
            self._unanswered(self.slots.slot_of(key), key)
        for key in action.executed:
            slot = self.slots.slot_of(key)
            if slot < 0:
                self._orphans.unexecute(key)
            else:
                self.slots.set_flags(slot, off=st.EXECUTED)
        for message_id, _ in action.final:
            self._set_final(message_id, None)
        for message_id, where in action.copies:
            self._copies.take_back(message_id, where)
