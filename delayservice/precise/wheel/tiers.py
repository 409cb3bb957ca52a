"""Where a record waits on disk, by how far out its second is: the wheel's tiers.

A slot file per second is right near the pointer, where records must leave to the
millisecond, but a year of them is 31 million files per partition, each costing
memory in the process that tracks it and an open/write/close at intake. Further out
the wheel keeps coarser "span" files: tier 1 holds `horizon` seconds per file, tier 2
24 of those, tier 3 32 of those (with the default horizon of 1 h: hour, day and
32-day spans). Every file, slot or span, is only appended to or deleted whole.

Each tier t below the top has a boundary b_t(now): a record whose second is below b_0
goes to its slot file, below b_1 to its tier-1 span, and so on. b_t is `now + w_{t+1}`
rounded up to a multiple of w_{t+1} (the next tier's width), so a span of tier t+1 is
either wholly below b_t (and must be split into finer files) or wholly above. Spans
are split at least one width of their own tier before their first second, so a record
reaches its slot file at least `horizon` before it is due. Files per partition are
bounded whatever the delays: 2 x horizon slot files, 48 + 64 spans of tiers 1 and 2,
and one tier-3 span per 32 days of `max_delay`.

The boundaries only move forward (the wheel keeps the highest it has computed), and a
restart recomputes them from the clock: a span that exists below a boundary, for
whatever reason, is simply split next.
"""

from __future__ import annotations

from typing import Final, NamedTuple

RATIOS: Final = (24, 32)
"""Width of tier 2 over tier 1, and of tier 3 over tier 2."""
DEFAULT_HORIZON_S: Final = 3600


class Tiers(NamedTuple):
    widths: tuple[int, ...]  # seconds per file, tier 0 (slots) first

    @classmethod
    def for_horizon(cls, horizon_s: int) -> Tiers:
        if horizon_s < 1:
            raise ValueError(f"horizon must be at least 1 s, got {horizon_s}")
        widths = [1, horizon_s]
        for ratio in RATIOS:
            widths.append(widths[-1] * ratio)
        return cls(tuple(widths))

    @property
    def top(self) -> int:
        return len(self.widths) - 1

    def boundaries(self, now: float) -> tuple[int, ...]:
        """b_t for every tier but the top: records below b_t belong in tier t or finer."""
        out = []
        for t in range(self.top):
            width = self.widths[t + 1]
            out.append(-(-int(now + width) // width) * width)  # ceil to a multiple
        return tuple(out)

    def place(self, second: int, bounds: tuple[int, ...]) -> tuple[int, int]:
        """(first second of its file, width of its file) for a record of `second`."""
        for t, bound in enumerate(bounds):
            if second < bound:
                width = self.widths[t]
                return second - second % width, width
        width = self.widths[-1]
        return second - second % width, width

    def due_for_split(self, start: int, width: int, bounds: tuple[int, ...]) -> bool:
        """A span whose tier's boundary has passed its first second, or one of a width
        no tier has (written under another horizon): split at once into today's tiers."""
        if width not in self.widths[1:]:
            return True
        return start < bounds[self.widths.index(width) - 1]


class Place(NamedTuple):
    """A file of the wheel: `width` 1 is a slot, anything else a span."""

    partition: int
    start: int
    width: int
