"""What the markers of one id do to one copy of its message: the rule, with no state.

A level message waits in its partition until due; a reschedule re-publishes it (a
copy, with the same id) and leaves the original to be withdrawn when its turn comes.
Each copy is an incarnation of the message, and a marker belongs to the incarnation
that was waiting when the broker appended it: one appended before that incarnation's
due time and after the marker that made it (the copy's `delay-moved-by`). Walking those
markers in the order they were appended:

- a reschedule already carried out (its copy exists, `executed`) ends this
  incarnation: it is withdrawn, and the later markers belong to the copy;
- a cancel calls the message off for good: every marker of the id, before or after,
  is answered `cancelled` (cancels win, as in precise mode);
- otherwise the last reschedule moves it (each reschedule answered `moved`, to the
  last one's time);
- with none of these it is forwarded, and the markers that came after its due time
  are `too_late`.

The same markers, the same due time and the same `executed` set give the same verdict
whoever asks and whenever: a daemon that reads a partition again after a crash decides
what the one before it decided, so a cancel needs nothing durable but its marker.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Final

from delayservice.markers.replies import CANCEL, CANCELLED, RESCHEDULE, reply_key

FORWARD: Final = "forward"
CANCEL_IT: Final = "cancel"
MOVE: Final = "move"
CLOSED: Final = "closed"
MOVED: Final = "moved"
TOO_LATE: Final = "too_late"

Order = tuple[int, int, int]
"""(append time, partition, offset) of a marker on the markers topic: their order."""


@dataclass(frozen=True, slots=True)
class LevelMarker:
    """A cancel or reschedule marker as read: `asked_due_ms` is a reschedule's new due
    time (the larger of its append time + `delay-ms` and `delay-due-ms`)."""

    kind: str
    message_id: str
    appended_ms: int
    topic: str
    partition: int
    offset: int
    asked_due_ms: int | None = None
    _key: bytes | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def key(self) -> bytes:
        """Where it landed: the key of its answers. Made when first asked for, then
        kept: the book looks it up several times for a marker it answers, and files
        most markers of a flood without it."""
        key = self._key
        if key is None:
            key = reply_key(self.topic, self.partition, self.offset)
            object.__setattr__(self, "_key", key)
        return key

    @property
    def order(self) -> Order:
        return (self.appended_ms, self.partition, self.offset)


@dataclass
class Verdict:
    action: str
    """FORWARD, CANCEL_IT (withdraw, cancelled), MOVE (carry out `marker`) or CLOSED
    (withdraw: `marker` moved it already)."""
    marker: LevelMarker | None = None
    answers: list[tuple[LevelMarker, str]] = field(default_factory=list)
    """(marker, outcome) this verdict settles: `cancelled`, `moved` or `too_late`."""


def verdict(
    markers: Iterable[LevelMarker],
    after: Order | None,
    due_ms: int,
    executed: Container[bytes],
) -> Verdict:
    """The verdict on the incarnation made by the marker at `after` (None: the message
    as first sent), due at `due_ms`, given every marker of its id (in any order) and
    the keys of the reschedules already carried out."""
    mine = sorted((m for m in markers if after is None or m.order > after), key=_order)
    before = [m for m in mine if m.appended_ms < due_ms]
    for marker in before:
        if marker.kind == CANCEL:
            return Verdict(CANCEL_IT, marker, [(m, CANCELLED) for m in mine])
        if marker.kind == RESCHEDULE and marker.key in executed:
            return Verdict(CLOSED, marker)
    moves = [m for m in before if m.kind == RESCHEDULE]
    if moves:
        return Verdict(MOVE, moves[-1], [(m, MOVED) for m in moves])
    return Verdict(FORWARD, None, [(m, TOO_LATE) for m in mine if m.appended_ms >= due_ms])


def _order(marker: LevelMarker) -> Order:
    return marker.order
