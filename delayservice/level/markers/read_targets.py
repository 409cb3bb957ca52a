"""Where the marker reader must read each partition to before that partition's gate
moves, and to which time.

Apart from the reader's loop because this is the rule that lets the gate follow a
flood's reading: a target is noted every round, queued behind those not reached yet,
and the gate moves to the time of the last one passed. With one target at a time, the
next noted only once the one before was reached, the targets of a backlog growing
faster than it was read were noted ever later, and a million markers held the flooded
partition's records 30 s where the markers appended before their time took a few to
read.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final

from delayservice.forward.buffer import TP

MAX_TARGETS: Final = 128
"""Targets queued per partition at most; a queue that is full keeps every other one, so
the times a flood's reading moves the gate by stay evenly spaced however long it lasts."""

BEHIND_STEP_S: Final = 1.0
"""How often the gate of a partition read behind its newest target moves: each move
wakes the forwarders waiting on it, and a flood's reading, moving it every batch, kept
them serving beside it (the reader slowed by a third)."""

Reached = dict[int, tuple[dict[int, int], dict[int, int]]]
"""Per gate generation, the time each markers and each outcomes partition (by number)
was read through."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where one partition is read to before its gate moves to `began_ms`: every record
    appended to it before then is below `end`."""

    began_ms: int
    end: int
    generation: int


class ReadTargets:
    def __init__(self, markers_topic: str) -> None:
        self._markers_topic = markers_topic
        self._queues: dict[TP, deque[Target]] = {}
        self._next_move: dict[TP, float] = {}
        """When (monotonic) each partition read behind its newest target moves next."""

    def clear(self) -> None:
        self._queues, self._next_move = {}, {}

    def clear_if_older(self, generation: int) -> None:
        """Forget every target when any was noted for another gate generation (a rewind
        since: the positions they were noted against no longer hold)."""
        if any(t.generation != generation for queue in self._queues.values() for t in queue):
            self.clear()

    def markers_pending(self) -> bool:
        """Whether a markers partition has a target it has not reached."""
        topic = self._markers_topic
        return any(tp[0] == topic for tp in self._queues)

    def note(self, tp: TP, target: Target) -> None:
        """Queue `target` behind `tp`'s others; a full queue keeps every other one first
        (the oldest among them: it is the nearest to being reached)."""
        queue = self._queues.setdefault(tp, deque())
        if queue and queue[-1].end == target.end and queue[-1].generation == target.generation:
            # Nothing appended since the last one: the later time, reached as soon.
            queue[-1] = target
            return
        if len(queue) >= MAX_TARGETS:
            queue = self._queues[tp] = deque(list(queue)[::2])
        queue.append(target)

    def passed(self, read_to: dict[TP, int], now: float) -> Reached:
        """Take every target `read_to` has passed; per partition, the time of the last.
        A partition still behind its newest target moves at most once a `BEHIND_STEP_S`
        (`now`: monotonic), counted from its last move: a round that passed nothing does
        not start the wait."""
        reached: Reached = {}
        for tp, queue in list(self._queues.items()):  # never empty: `note` appends
            at = read_to.get(tp, -1)
            if at < queue[0].end:
                continue  # nothing passed: no move
            if at < queue[-1].end:
                if now < self._next_move.get(tp, 0.0):
                    continue
                self._next_move[tp] = now + BEHIND_STEP_S
            target = queue.popleft()
            while queue and at >= queue[0].end:
                target = queue.popleft()
            if not queue:
                del self._queues[tp]
                self._next_move.pop(tp, None)  # caught up: the next flood's first move waits not
            markers, outcomes = reached.setdefault(target.generation, ({}, {}))
            (markers if tp[0] == self._markers_topic else outcomes)[tp[1]] = target.began_ms
        return reached
