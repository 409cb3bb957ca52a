"""Delay levels: the fixed set of delays, each backed by one topic.

The level policy comes from the source material: a delay goes to the smallest level
that is at least the requested delay and is delivered at that level's delay, so the
error is at most the gap between two neighbouring levels. Keeping the set fixed keeps
the topic count small, and because every record in one level topic has the same delay,
each partition is already in due order.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass

from delayservice.errors import ConfigError, DelayTooLongError

DEFAULT_LEVELS = "5s,10s,30s,1m,2m,5m,10m,20m,30m,45m,1h,2h"
DEFAULT_TOPIC_PREFIX = "delay_topic_"

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")


def parse_duration_ms(text: str) -> int:
    """Parse `500ms`, `5s`, `1m`, `2h` or `1d` into milliseconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration like 500ms, 5s, 1m, 2h or 1d")
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


def format_duration_ms(ms: int) -> str:
    """The shortest exact spelling of a duration, the inverse of `parse_duration_ms`."""
    for unit in ("d", "h", "m", "s"):
        size = _UNIT_MS[unit]
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


@dataclass(frozen=True, slots=True)
class Level:
    """One delay level: its 1-based index, its delay and the topic that holds it."""

    index: int
    delay_ms: int
    topic: str

    @property
    def name(self) -> str:
        return format_duration_ms(self.delay_ms)


class LevelSet:
    """The ordered levels, shared by the producer wrapper and the daemon."""

    def __init__(self, delays_ms: list[int], topic_prefix: str = DEFAULT_TOPIC_PREFIX) -> None:
        if not delays_ms:
            raise ConfigError("levels", "at least one level is needed")
        if any(d <= 0 for d in delays_ms):
            raise ConfigError("levels", "every level must be longer than 0")
        if any(b <= a for a, b in itertools.pairwise(delays_ms)):
            raise ConfigError("levels", "levels must be strictly increasing")
        if not topic_prefix:
            raise ConfigError("topic_prefix", "must not be empty")
        self._delays = list(delays_ms)
        self.levels = [Level(i + 1, d, f"{topic_prefix}{i + 1}") for i, d in enumerate(delays_ms)]
        self._by_topic = {level.topic: level for level in self.levels}

    @classmethod
    def parse(cls, text: str, topic_prefix: str = DEFAULT_TOPIC_PREFIX) -> LevelSet:
        """Build from a setting such as `5s,10s,30s,1m`."""
        parts = [p for p in text.split(",") if p.strip()]
        try:
            delays = [parse_duration_ms(p) for p in parts]
        except ValueError as exc:
            raise ConfigError("levels", str(exc)) from exc
        return cls(delays, topic_prefix)

    def __iter__(self) -> Iterator[Level]:
        return iter(self.levels)

    def __len__(self) -> int:
        return len(self.levels)

    @property
    def max_delay_ms(self) -> int:
        return self._delays[-1]

    def select(self, delay_ms: int) -> Level:
        """The smallest level whose delay is at least `delay_ms`."""
        pos = bisect.bisect_left(self._delays, delay_ms)
        if pos == len(self._delays):
            raise DelayTooLongError(
                f"delay of {delay_ms} ms is above the top level "
                f"({format_duration_ms(self.max_delay_ms)}); "
                "add a longer level or shorten the delay"
            )
        return self.levels[pos]

    def by_topic(self, topic: str) -> Level | None:
        return self._by_topic.get(topic)

    def previous_delay_ms(self, level: Level) -> int:
        """The next shorter level's delay (0 below the first): an envelope asking for no
        more than that belongs to that level, not to `level`."""
        return max((d for d in self._delays if d < level.delay_ms), default=0)

    def spec(self) -> str:
        """The setting string that recreates this set."""
        return ",".join(level.name for level in self.levels)
