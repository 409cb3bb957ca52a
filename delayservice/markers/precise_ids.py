"""Where a precise-mode message lives: the rule the producer and the daemon share.

Precise mode has two topics: the precise topic for exact delays up to
`precise_far_after`, and the far topic (`{precise_topic}_far`) for longer ones, read by
an intake of its own so that a flood of far-future messages never holds up one due in
seconds. An exact message's id names the topic and the partition it was sent to:
`<32 hex digits>-p<partition>` on the precise topic, `-f<partition>` on the far one.
A cancel or reschedule goes where its id points. Adding partitions changes nothing for
messages already sent, and a marker needs no metadata and no copies to other
partitions: the instances holding the message are the ones that read it, and a marker
anywhere else can never match.
"""

from __future__ import annotations

import re
import zlib
from typing import Final, NamedTuple

from delayservice.envelope import new_id

_ID_PLACE: Final = re.compile(r"[0-9a-f]{32}-([pf])(0|[1-9][0-9]{0,8})")
_FAR: Final = "f"


class Place(NamedTuple):
    far: bool
    partition: int


def precise_id(partitions: int, *, far: bool = False) -> tuple[str, int]:
    """A new exact message's id and the partition it goes to, which the id names. The
    partition is crc32 of the random part over the partition count known now; naming
    it in the id lets a marker find the message after the topic has grown, with no
    metadata and no copies to other partitions."""
    if partitions < 1:
        raise ValueError(f"a topic has at least 1 partition, got {partitions}")
    random_part = new_id()
    partition = zlib.crc32(random_part.encode()) % partitions
    return f"{random_part}-{_FAR if far else 'p'}{partition}", partition


def named_place(message_id: str) -> Place | None:
    """The topic and partition an id from `precise_id` names; None for any other id."""
    match = _ID_PLACE.fullmatch(message_id)
    if match is None:
        return None
    return Place(match.group(1) == _FAR, int(match.group(2)))


def named_partition(message_id: str, *, far: bool = False) -> int | None:
    """The partition of the precise topic (or, with `far`, of the far topic) an id
    names; None for an id that names none of that topic's."""
    place = named_place(message_id)
    return place.partition if place is not None and place.far == far else None


def names_elsewhere(message_id: str, partition: int, *, far: bool) -> bool:
    """Whether the id names a place other than this partition of this topic: a marker
    read here can then never match (a legacy id, naming none, may match anywhere)."""
    place = named_place(message_id)
    return place is not None and place != (far, partition)


def precise_partition(message_id: str, partitions: int) -> int:
    """The partition of the precise topic that holds the message with `message_id`.

    An id from `precise_id` names its partition, whatever `partitions` is now. Any
    other id (hand-made, or from a producer before ids named their partition) falls
    back to crc32 of the id over the current count, which adding partitions changes.
    crc32, not `hash()`, because Python salts string hashes per process.
    """
    if partitions < 1:
        raise ValueError(f"a topic has at least 1 partition, got {partitions}")
    place = named_place(message_id)
    if place is not None:
        return place.partition
    return zlib.crc32(message_id.encode()) % partitions
