"""Where a precise-mode message lives: the rule the producer and the daemon share.

An exact message's id names the partition of the precise topic it was sent to,
`<32 hex digits>-p<partition>`, and a cancel goes to that partition. Adding partitions
to the precise topic changes nothing for messages already sent, and a cancel needs no
metadata and no copies to other partitions: the instances holding the message are the
ones that read its cancel, and a marker on any other partition can never match.
"""

from __future__ import annotations

import re
import zlib
from typing import Final

from delayservice.envelope import new_id

_ID_PARTITION: Final = re.compile(r"[0-9a-f]{32}-p(0|[1-9][0-9]{0,8})")


def precise_id(partitions: int) -> tuple[str, int]:
    """A new exact message's id and the partition it goes to, which the id names:
    `<32 hex digits>-p<partition>`. The partition is crc32 of the random part over the
    partition count known now; naming it in the id lets a cancel find the message after
    the topic has grown, with no metadata and no copies to other partitions."""
    if partitions < 1:
        raise ValueError(f"a topic has at least 1 partition, got {partitions}")
    random_part = new_id()
    partition = zlib.crc32(random_part.encode()) % partitions
    return f"{random_part}-p{partition}", partition


def named_partition(message_id: str) -> int | None:
    """The partition an id from `precise_id` names; None for any other id."""
    match = _ID_PARTITION.fullmatch(message_id)
    return int(match.group(1)) if match else None


def precise_partition(message_id: str, partitions: int) -> int:
    """The partition of the precise topic that holds the message with `message_id`.

    The one rule both sides share: a message and every later cancel of it go to this
    partition, so the daemon instance holding the message reads the cancel too. An id
    from `precise_id` names its partition, whatever `partitions` is now. Any other id
    (hand-made, or from a producer before ids named their partition) falls back to
    crc32 of the id over the current count, which adding partitions changes. crc32, not
    `hash()`, because Python salts string hashes per process.
    """
    if partitions < 1:
        raise ValueError(f"a topic has at least 1 partition, got {partitions}")
    named = named_partition(message_id)
    if named is not None:
        return named
    return zlib.crc32(message_id.encode()) % partitions
