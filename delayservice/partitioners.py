"""Where a keyed record lands on its target: the partitioner its producer uses.

An undelayed send is placed by the producer's own partitioner; a delayed one is placed
by the daemon's producer when it is forwarded. For both to agree, the envelope says
which partitioner the application's producer uses (`delay-partitioner`, written by
`DelayProducer` from its `partitioner` setting), and the daemon places a keyed record
with that hash over the target's partition count at the time of the forward, as an
undelayed send at that moment would be. These are librdkafka's partitioners
(rdkafka_msg.c `rd_kafka_msg_partitioner_*`):

| partitioner         | a keyed record goes to                 |
| ------------------- | -------------------------------------- |
| `consistent_random` | CRC32(key) mod n; an empty key: random  |
| `consistent`        | CRC32(key) mod n                       |
| `murmur2_random`    | murmur2(key) & 0x7fffffff mod n (Java)  |
| `murmur2`           | the same                               |
| `fnv1a_random`      | FNV-1a(key) mod n (Sarama's)            |
| `fnv1a`             | the same                               |
| `random`            | any partition                          |

A record without a key (None) is placed as librdkafka places one under every
partitioner but `random`: on a sticky partition, whatever the hash (rdkafka_msg.c
`rd_kafka_msg_partitioner`); so is a record with no envelope field (a Java producer's,
or a version of `DelayProducer` before the field): the daemon's producer hashes its key
with murmur2, Java's default. `place` returns None for every case the daemon's own
producer (`murmur2_random`) already places that way.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Final

DEFAULT: Final = "consistent_random"
"""librdkafka's default, and so confluent-kafka's."""
NAMES: Final = frozenset(
    {
        "consistent_random",
        "consistent",
        "murmur2_random",
        "murmur2",
        "fnv1a_random",
        "fnv1a",
        "random",
    }
)


def fnv1a(key: bytes) -> int:
    """librdkafka's `rd_fnv1a`: 32-bit FNV-1a, then the absolute value of the signed
    result (Sarama's `NewHashPartitioner`)."""
    h = 0x811C9DC5
    for byte in key:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    if h & 0x80000000:
        h = (-(h - 0x100000000)) & 0xFFFFFFFF
    return h


def _crc32(key: bytes, count: int) -> int | None:
    return zlib.crc32(key) % count


def _crc32_or_sticky(key: bytes, count: int) -> int | None:
    return zlib.crc32(key) % count if key else None


def _fnv1a(key: bytes, count: int) -> int | None:
    return fnv1a(key) % count


_PLACES: Final[dict[str, Callable[[bytes, int], int | None]]] = {
    "consistent_random": _crc32_or_sticky,
    "consistent": _crc32,
    "fnv1a_random": _fnv1a,
    "fnv1a": _fnv1a,
}


def place(partitioner: str | None, key: bytes | None, count: int) -> int | None:
    """The partition of a record with `key` among `count` under `partitioner`, or None
    where the daemon's producer places it the same way (a record without a key, murmur2,
    random, no partitioner named)."""
    if partitioner is None or key is None:
        return None
    rule = _PLACES.get(partitioner)
    return None if rule is None else rule(key, count)
