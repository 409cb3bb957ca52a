"""What the marker book knows of markers it does not keep: the answers read back from
the outcomes topic before their marker (a marker read after its answer, or one let go),
and the final states of messages whose ids have no marker kept.

Apart from the book's columns because none of it has a slot: it is kept by answer key
and by id in small dictionaries, taken over by a marker when it is filed (`take`), and
forgotten by time (`expire`) or when the book is at its share (`shed`).
"""

from __future__ import annotations

from delayservice.level.markers import store as st
from delayservice.markers.replies import MarkerReply


class OrphanAnswers:
    __slots__ = ("answers", "executed", "loose_final", "written")

    def __init__(self) -> None:
        self.written: dict[bytes, int] = {}
        """Answers read before their marker (or for one not kept): key -> when written."""
        self.answers: dict[bytes, tuple[str, str, str]] = {}
        """Key -> (outcome, id, kind) of an answer read back before its marker."""
        self.executed: set[bytes] = set()
        self.loose_final: dict[str, tuple[str, int]] = {}
        """Id with no marker kept -> (its message's final state, when noted)."""

    def take(self, key: bytes, message_id: str, kind: str) -> tuple[str | None, int]:
        """What was read back of a marker before the marker itself: (its answer's
        outcome, its flags)."""
        flags = 0
        self.written.pop(key, None)
        orphan = self.answers.pop(key, None)
        if key in self.executed:
            self.executed.discard(key)
            flags |= st.EXECUTED
        if orphan is not None and orphan[1:] == (message_id, kind):
            flags |= st.READ_BACK
        return None if orphan is None else orphan[0], flags

    def read(self, key: bytes, written_ms: int) -> None:
        """An answer under `key` was read back, its marker not kept."""
        self.written[key] = written_ms

    def answered(self, key: bytes, outcome: str, reply: MarkerReply | None, now_ms: int) -> None:
        """An answer to a marker not kept (of a forwarder's, without `reply`, nothing
        is kept)."""
        if reply is not None:
            self.answers[key] = (outcome, reply.message_id, reply.kind)
            self.written.setdefault(key, now_ms)

    def unanswered(self, key: bytes) -> None:
        self.answers.pop(key, None)

    def execute(self, key: bytes, now_ms: int) -> None:
        self.executed.add(key)
        self.written.setdefault(key, now_ms)

    def unexecute(self, key: bytes) -> None:
        self.executed.discard(key)

    def set_final(self, message_id: str, state: str | None, now_ms: int) -> None:
        if state is None:
            self.loose_final.pop(message_id, None)
        else:
            self.loose_final[message_id] = (state, now_ms)

    def final_of(self, message_id: str) -> str | None:
        loose = self.loose_final.get(message_id)
        return None if loose is None else loose[0]

    def take_final(self, message_id: str) -> str | None:
        """The final state of an id that now has a marker kept (it keeps it)."""
        loose = self.loose_final.pop(message_id, None)
        return None if loose is None else loose[0]

    def expire(self, before_ms: int) -> None:
        for key in [key for key, ms in self.written.items() if ms < before_ms]:
            del self.written[key]
            self.answers.pop(key, None)
            self.executed.discard(key)
        for message_id in [m for m, (_, ms) in self.loose_final.items() if ms < before_ms]:
            del self.loose_final[message_id]

    def shed(self) -> None:
        """Let go of the answers (but for moves carried out): a marker read again is
        answered again, to the same outcome."""
        for key in [k for k in self.answers if k not in self.executed]:
            del self.answers[key]
            self.written.pop(key, None)

    def count(self) -> int:
        """How many things are kept (each counted as a dictionary's item)."""
        return len(self.written) + len(self.answers) + len(self.executed) + len(self.loose_final)
