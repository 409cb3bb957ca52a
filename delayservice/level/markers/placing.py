"""What a marker's id names against this daemon's level topics: which level partition's
owner answers it, its message's send time and level delay, or why it is refused (no
level and partition in the id, no such level here, a partition past the level topic's
count, a new time beyond the top level).

Apart from the marker book because it needs nothing the book keeps, only the levels and
each level topic's partition count as the reader last saw it (`partitions`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from delayservice.forward.buffer import TP
from delayservice.level.markers.entry import Entry
from delayservice.level.markers.verdict import LevelMarker
from delayservice.levels import LevelSet
from delayservice.markers.level_ids import level_place, tail_partition

REFUSED: Final = "refused"
UNMATCHED: Final = "unmatched"


class Placing:
    __slots__ = ("_counts", "_delays", "_levels", "answers_tp", "fewest", "most", "partitions")

    def __init__(self, levels: LevelSet) -> None:
        self._levels = levels
        self._delays = {level.topic: level.delay_ms for level in levels.levels}
        """Level topic -> its delay (`levels.by_topic` without a call, per entry made)."""
        self.answers_tp: TP = (levels.levels[0].topic, 0)
        """Whose owner answers the markers that name no level partition here."""
        self._counts: dict[str, int] = {}
        self.partitions: Mapping[str, int] = MappingProxyType(self._counts)
        """Level topic -> its partition count, as the reader last saw it (read only:
        `partition_count` alone changes it, and `fewest` and `most` with it)."""
        self.fewest = 0
        """The fewest partitions of a level topic counted (0: none counted yet)."""
        self.most = 0
        """The most partitions of a level topic counted: kept, not worked out for each
        marker of a flood (`beyond_count`, `MarkerFiling._place`)."""

    def entry(self, marker: LevelMarker, refusal: tuple[str, str] | None) -> Entry:
        """The entry of a marker read (`refusal`: decided on reading)."""
        if refusal is not None:
            return Entry(marker, self.answers_tp, refusal)
        place = level_place(marker.message_id)
        if place is None:
            reason = (
                "this id names no level and partition (an id from before ids named them, "
                "or not a level message's): its message cannot be found; level messages "
                "sent now have ids ending in -l<level>p<partition>"
            )
            return Entry(marker, self.answers_tp, (UNMATCHED, reason))
        levels = self._levels.levels
        if place.level > len(levels):
            return Entry(marker, self.answers_tp, (REFUSED, f"no level {place.level} here"))
        level = levels[place.level - 1]
        count = self._counts.get(level.topic)
        if count is not None and place.partition >= count:
            reason = f"{level.topic} has no partition {place.partition} (it has {count})"
            return Entry(marker, self.answers_tp, (REFUSED, reason))
        tp = (level.topic, place.partition)
        if (
            marker.asked_due_ms is not None
            and marker.asked_due_ms - marker.appended_ms > self._levels.max_delay_ms
        ):
            ahead_s = (marker.asked_due_ms - marker.appended_ms) / 1000
            reason = f"the new time is {ahead_s:g} s ahead, beyond the top level ({self._top()})"
            return Entry(marker, tp, (REFUSED, reason), place.sent_ms, level.delay_ms)
        return Entry(marker, tp, None, place.sent_ms, level.delay_ms)

    def placed(
        self,
        marker: LevelMarker,
        tp: TP,
        refusal: tuple[str, str] | None,
        slot: int,
        sent_ms: int | None,
    ) -> Entry:
        """The entry of a marker kept whose id names a level partition (`sent_ms`: read
        off a packed id; None: read off the id here)."""
        if sent_ms is None:
            place = level_place(marker.message_id)
            sent_ms = None if place is None else place.sent_ms
        return Entry(marker, tp, refusal, sent_ms, self._delays.get(tp[0], 0), slot)

    def _top(self) -> str:
        return self._levels.levels[-1].name

    def partition_count(self, topic: str, count: int) -> None:
        self._counts[topic] = count
        self.fewest = min(self._counts.values())
        self.most = max(self._counts.values())

    def beyond_count(self, message_id: str, named: int | None = None) -> bool:
        """Whether `message_id` names a partition past its level topic's count as last
        read: refused on that count, unless the count was read after the marker (the
        topic may have grown since, and its message be on the new partition). `named`:
        its `tail_partition`, when the caller has it already."""
        if named is None:
            named = tail_partition(message_id)
        if named is None:
            return False  # not a level id (`level_place` answers it so)
        if named < self.fewest:
            return False  # most markers: a partition every level topic has (no parse)
        place = level_place(message_id)
        levels = self._levels.levels
        if place is None or not 0 < place.level <= len(levels):
            return False
        count = self._counts.get(levels[place.level - 1].topic)
        return count is not None and place.partition >= count
