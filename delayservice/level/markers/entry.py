"""What the marker book files for each marker: the marker and who answers it. Apart
from the book, so that its views (`views`) can name it without importing it."""

from __future__ import annotations

from dataclasses import dataclass

from delayservice.forward.buffer import TP
from delayservice.level.markers.verdict import LevelMarker


@dataclass(slots=True)
class Entry:
    """A marker and who answers it: the owner of `tp` (the partition its id names, or
    for a marker that names none, of the first level's partition 0)."""

    marker: LevelMarker
    tp: TP
    refusal: tuple[str, str] | None = None
    """(outcome, reason) decided on reading: a marker that asks nothing a daemon can do."""
    sent_ms: int | None = None
    """When the id says its message was sent (the producer's clock)."""
    delay_ms: int = 0
    """The delay of the level the id names."""
    slot: int = -1
    """Where the book keeps it, when the entry was made (`MarkerBook.park` takes it)."""
