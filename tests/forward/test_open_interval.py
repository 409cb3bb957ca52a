"""`OpenInterval.fenced`: the offsets an exactly-once transaction carries for the
partitions a marker decided about with no record of theirs sent (a move made ahead of
its message's due time)."""

from __future__ import annotations

from typing import Any

from delayservice.forward.buffer import TP
from delayservice.forward.failures import Key
from delayservice.forward.open_interval import OpenInterval

A0: TP = ("delay_topic_2", 0)
A1: TP = ("delay_topic_2", 1)
B0: TP = ("delay_topic_3", 0)


class _Decided:
    def __init__(self, decided: dict[TP, int | None]) -> None:
        self.decided = decided

    def open(self) -> bool:
        return bool(self.decided)

    def settled(self) -> None:
        self.decided = {}

    def dropped(self, spots: set[Key] | None = None, tps: set[TP] | None = None) -> None:
        self.decided = {}

    def decided_on(self) -> dict[TP, int | None]:
        return dict(self.decided)


def _interval(decided: dict[TP, int | None]) -> OpenInterval:
    buffer: Any = None  # `fenced` reads no queue of its own
    interval = OpenInterval(buffer)
    interval.listener = _Decided(decided)
    return interval


def test_a_partition_decided_about_commits_where_it_stands() -> None:
    interval = _interval({A0: 7, A1: 3, B0: None})
    interval.sent_through[A1] = 5  # committed there before: not in `committable`
    interval.committed[A1] = 5
    offsets = {B0: 2}

    fenced = interval.fenced(offsets)

    assert fenced == {A0: 7, A1: 5, B0: 2}
    assert offsets == {B0: 2}  # the caller's dict is left as it was


def test_what_committable_gives_is_kept_and_a_partition_with_nothing_queued_is_left_out() -> None:
    interval = _interval({A0: 4, B0: None})
    assert interval.fenced({A0: 9}) == {A0: 9}


def test_without_decisions_the_offsets_are_the_same() -> None:
    offsets = {A0: 1}
    assert _interval({}).fenced(offsets) == {A0: 1}
    bare: Any = None
    assert OpenInterval(bare).fenced(offsets) == {A0: 1}
