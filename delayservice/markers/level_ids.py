"""Where a level message lives: the rule the producer and the daemon share.

A level message's id names its level and the partition of that level's topic it was
sent to, and the time it was sent: `<12 hex digits of the send time, epoch ms><20 random
hex digits>-l<level>p<partition>`, for example `0192f3a4b5c61f0e9d8c7b6a5948-l3p1`. The
producer picks the partition itself, by the key with the application's partitioner (so
a key's messages keep their order within a level), and writes it in the id. A cancel or
reschedule then needs no search: the daemon that owns that partition decides it, and
only that partition's forwarding checks the id. The send time bounds when the message
can be due (`sent_ms` + the level's delay, give or take the producer's clock), which is
how the daemon tells a cancel that came after the delivery from one for an id that
never was.

An id of any other form (the 32 hex digits level ids had before, a hand-made one) names
no place: its markers are answered `unmatched`, with the reason.
"""

from __future__ import annotations

import re
import secrets
import time
import zlib
from typing import Final, NamedTuple

MAX_PARTITION_DIGITS: Final = 10
"""The most digits a level id's partition has; a longer tail is no level id, and is
not turned into an int (a hostile id of thousands of digits)."""
_LEVEL_ID: Final = re.compile(r"([0-9a-f]{12})[0-9a-f]{20}-l([1-9][0-9]{0,3})p(0|[1-9][0-9]{0,8})")
MAX_PARTITION: Final = 2**31 - 1


class LevelPlace(NamedTuple):
    """What a level id names: the level (1-based, as in the level topic's name), the
    partition of its topic, and when the producer sent the message (its clock)."""

    level: int
    partition: int
    sent_ms: int


def level_id(level: int, partition: int, sent_ms: int | None = None) -> str:
    """A new level message's id, naming its level, partition and send time."""
    if level < 1 or not 0 <= partition <= MAX_PARTITION:
        raise ValueError(f"no level {level} partition {partition}")
    sent = int(time.time() * 1000) if sent_ms is None else sent_ms
    return f"{sent & 0xFFFFFFFFFFFF:012x}{secrets.token_hex(10)}-l{level}p{partition}"


def level_place(message_id: str) -> LevelPlace | None:
    """The place a level id names; None for any other id."""
    match = _LEVEL_ID.fullmatch(message_id)
    if match is None:
        return None
    return LevelPlace(int(match.group(2)), int(match.group(3)), int(match.group(1), 16))


def is_level_id(message_id: str) -> bool:
    return _LEVEL_ID.fullmatch(message_id) is not None


def tail_partition(message_id: str) -> int | None:
    """The partition a level id names, read off its tail without matching the whole id
    (cheap, for every marker read): None when the tail is no partition. Any id whose
    tail looks like one passes; `level_place` decides whether it is a level id."""
    _, p, tail = message_id.rpartition("p")
    if not (p and tail.isascii() and tail.isdigit() and len(tail) <= MAX_PARTITION_DIGITS):
        return None
    return int(tail)


def marker_partition(message_id: str, partitions: int) -> int:
    """The partition of the markers topic (of `partitions`) where a marker of a level
    message's id goes: its level partition modulo the count, so a daemon reading the
    markers of a level partition finds them on one markers partition, and a flood of
    markers on one holds back only the records whose markers go there. An id naming no
    level partition (one from before ids named their place) goes by a hash of the id,
    so one id's markers keep their order either way."""
    place = level_place(message_id)
    if place is not None:
        return place.partition % partitions
    return zlib.crc32(message_id.encode()) % partitions
