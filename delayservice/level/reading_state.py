"""Where the consumer thread stands on each partition it reads: which it owns, which it
paused (and since when), which it must seek back, which wait for a resume after an
assignment; and whether the group has assigned it anything yet.

Admitting records, the rebalance callbacks and a re-seek all change it, on the one
consumer thread; it sits below all three so that none of them needs another to know it.
librdkafka keeps a partition's pause state across re-assignment, so the paused set is
tracked here rather than trusted to the client.
"""

from __future__ import annotations

import threading

from delayservice.forward.buffer import TP


class ReadingState:
    def __init__(self) -> None:
        self.owned: frozenset[TP] = frozenset()
        """Replaced, never changed in place: readiness reads it on the HTTP thread."""
        self.paused: set[TP] = set()
        self.paused_since: dict[TP, float] = {}
        self.rewind: dict[TP, int] = {}
        """partition -> the offset it is sought back to before it is read again."""
        self.next: dict[TP, int] = {}
        """partition -> where its next record to admit stands: after the last one admitted,
        or where it was last sought (its start, a rewind). consume() moves the client past
        every record it fetched, even in a call that then raises (a callback failed
        inside it: confluent-kafka destroys the batch), so after a failed iteration each
        partition is sought back here (`RecordAdmission.rewind_unadmitted`)."""
        self.to_resume_on_assign: list[TP] = []
        self.first_assignment = threading.Event()
        """Set once the group has given this instance its first assignment (maybe empty)."""
        self.unassigned_since: float | None = None
        """Monotonic time the worker lost its partitions and has not been assigned since."""

    def assigned(self, tp: TP, start: int) -> None:
        """`tp` is owned from here on, read from `start` (an offset, or a logical one),
        and resumed."""
        self.owned = self.owned | {tp}
        self.paused.discard(tp)
        self.rewind.pop(tp, None)
        self.next[tp] = start
        self.to_resume_on_assign.append(tp)

    def let_go(self, gone: set[TP]) -> None:
        """`gone` is no longer owned: nothing of it is paused or sought back."""
        self.owned = self.owned - gone
        self.paused -= gone
        for tp in gone:
            self.rewind.pop(tp, None)
            self.next.pop(tp, None)
            self.paused_since.pop(tp, None)

    def restart(self) -> None:
        """A new client: no assignment, pause, seek or resume of the old one carries
        over."""
        self.to_resume_on_assign.clear()
        self.first_assignment.clear()
        self.unassigned_since = None
        self.paused.clear()
        self.rewind.clear()
        self.next.clear()
