"""What a level worker's markers decided in the open interval, and their answers.

Every answer goes to the outcomes topic through the worker's own producer, so under
exactly-once a move, its answer and whatever it withdrew commit in one transaction;
all of it is noted in the book at once and taken back if the interval does not commit
(the open interval calls `settled`, `dropped`, through the worker's markers). The answer
`moved` is what says a copy exists, so under at-least-once it is written only after
the flush that made the copy durable (`settled`): a copy refused by the broker, or lost
with a killed daemon, leaves no answer behind, and the move is made again (twice at
worst, never lost).

Apart from the worker's markers (`actions`) because it follows the commit
points, not the records: what was decided is kept until the interval ends either way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from delayservice.forward.buffer import TP
from delayservice.forward.failures import Key
from delayservice.level.markers.book import Action, MarkerBook
from delayservice.level.markers.entry import Entry
from delayservice.level.markers.route import MarkerSender
from delayservice.level.markers.search import QueueSearch
from delayservice.level.markers.verdict import MOVED, LevelMarker, Verdict
from delayservice.levels import LevelSet
from delayservice.markers.replies import MarkerReply
from delayservice.metrics.service_metrics import ServiceMetrics


class OpenAnswers:
    def __init__(
        self,
        book: MarkerBook,
        search: QueueSearch,
        levels: LevelSet,
        outcomes_topic: str,
        metrics: ServiceMetrics,
        *,
        transactional: bool,
    ) -> None:
        self._book = book
        self._search = search
        self._levels = levels
        self._outcomes = outcomes_topic
        self._metrics = metrics
        self._transactional = transactional
        self._open: list[tuple[Key | None, TP, Action]] = []
        self._deferred: list[tuple[Action, bytes, bytes]] = []
        """At-least-once: answers `moved` to write once their copy is durable, with the
        action that made it (answer value, key)."""
        self._failed_actions: list[Action] = []
        self.sender: MarkerSender | None = None
        """What the deferred answers are written through (the last one decided with)."""
        self.begin: Callable[[], None] = lambda: None
        """Runs before a serve pass produces anything (exactly-once: begins the
        transaction)."""

    def answer_all(
        self, found: Verdict, action: Action, sender: MarkerSender, copy: TP | None
    ) -> None:
        """Answer what the verdict settles (a move: each reschedule `moved`, to the time
        of the last one, with where its copy went)."""
        moved_to = found.marker.asked_due_ms if found.marker is not None else None
        where = f"{copy[0]}:{copy[1]}" if copy is not None else None
        for marker, outcome in found.answers:
            if self._book.is_answered(marker.key):
                continue
            if outcome == MOVED:
                self.answer(
                    marker, outcome, action, sender, due_ms=moved_to, copy=where,
                    defer=where is not None and not self._transactional,
                )  # fmt: skip
            else:
                self.answer(marker, outcome, action, sender)

    def answer(
        self,
        marker: LevelMarker,
        outcome: str,
        action: Action,
        sender: MarkerSender,
        *,
        due_ms: int | None = None,
        reason: str | None = None,
        copy: str | None = None,
        defer: bool = False,
    ) -> None:
        reply = MarkerReply(
            marker.kind, marker.message_id, outcome, due_ms, None, None, reason, copy
        )
        action.answers.append((marker.key, outcome))
        if defer:
            self._deferred.append((action, reply.encode(), marker.key))
            return
        self.begin()
        sender.answer(
            self._outcomes, reply.encode(), marker.key, functools.partial(self._failed, marker.key)
        )

    def _failed(self, key: bytes, error: Any, _message: Any) -> None:
        """An answer the broker refused (at-least-once): given again later."""
        if error is not None:
            self._book.take_back(Action(answers=[(key, "")]))

    def copy_failed(self, action: Action, error: Any, _message: Any) -> None:
        """A copy made apart from its original's send was refused: the move is made
        again, and its deferred answer is not written."""
        if error is not None:
            self._failed_actions.append(action)
            self._book.take_back(action)
            self._search.again()  # its message is searched for again

    def note(self, spot: Key | None, tp: TP, action: Action) -> None:
        if action.answers or action.executed or action.final or action.copies:
            self._book.apply(action)
            self._open.append((spot, tp, action))

    # -- the open interval's listener ------------------------------------------------------
    def open(self) -> bool:
        return bool(self._open)

    def settled(self) -> None:
        """The interval committed: count its answers, and (at-least-once) write the
        answers of the moves whose copies it made durable, for the next commit point."""
        failed = self._failed_actions
        for _, _, action in self._open:
            if any(action is f for f in failed):
                continue
            for key, outcome in action.answers:
                entry = self._book.keys.get(key)
                level, kind = self._labels(entry)
                self._metrics.level_markers.labels(level, kind, outcome).inc()
        deferred = [d for d in self._deferred if not any(d[0] is f for f in failed)]
        tp_of = {id(action): tp for _, tp, action in self._open}
        self._open.clear()
        self._deferred.clear()
        self._failed_actions = []
        for action, value, key in deferred:
            if self.sender is None or id(action) not in tp_of:
                continue
            self.sender.answer(self._outcomes, value, key, functools.partial(self._failed, key))
            written = Action(answers=[a for a in action.answers if a[0] == key])
            self._open.append((None, tp_of[id(action)], written))

    def partitions(self) -> list[TP]:
        """The partitions decided about in the interval, in the order first decided."""
        return list(dict.fromkeys(tp for _, tp, _ in self._open))

    def _labels(self, entry: Entry | None) -> tuple[str, str]:
        if entry is None:
            return "-", "-"
        level = self._levels.by_topic(entry.tp[0]) if entry.refusal is None else None
        return (level.name if level is not None else "-"), entry.marker.kind

    def dropped(self, spots: set[Key] | None = None, tps: set[TP] | None = None) -> None:
        """The interval (or what it held of `spots`, or of `tps`) will not commit: what
        it decided is decided again."""
        kept = []
        for spot, tp, action in self._open:
            if (spots is not None and spot not in spots) or (tps is not None and tp not in tps):
                kept.append((spot, tp, action))
            else:
                self._book.take_back(action)
                self._deferred = [d for d in self._deferred if d[0] is not action]
                self._search.again()  # what it decided is searched for again
        self._open = kept
