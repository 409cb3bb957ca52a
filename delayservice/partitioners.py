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
from typing import Any, Final

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


def murmur2(key: bytes) -> int:
    """Kafka's murmur2 (the Java client's `Utils.murmur2`, librdkafka's `rd_murmur2`),
    as a signed 32-bit result."""
    m = 0x5BD1E995
    length = len(key)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(key[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest = length % 4
    if rest == 3:
        h ^= key[whole + 2] << 16
    if rest >= 2:
        h ^= key[whole + 1] << 8
    if rest >= 1:
        h ^= key[whole]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - 0x100000000 if h & 0x80000000 else h


def _murmur2(key: bytes, count: int) -> int | None:
    return (murmur2(key) & 0x7FFFFFFF) % count


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


_KEYED: Final[dict[str, Callable[[bytes, int], int | None]]] = {
    **_PLACES,
    "murmur2_random": _murmur2,
    "murmur2": _murmur2,
}
"""Every hashing partitioner, murmur2 too: what `keyed_partition` needs, where no
producer of the daemon's hashes the key for it."""


def configured(config: dict[str, Any]) -> str:
    """The partitioner a confluent-kafka producer config sets: the top-level
    `partitioner`, else the one in the (deprecated, still honoured) `default.topic.config`
    dict, else librdkafka's default."""
    nested = config.get("default.topic.config")
    if "partitioner" not in config and isinstance(nested, dict) and "partitioner" in nested:
        return str(nested["partitioner"])
    return str(config.get("partitioner", DEFAULT))


def keyed_partition(partitioner: str | None, key: bytes | None, count: int) -> int | None:
    """The partition among `count` that `partitioner` gives `key`, murmur2 (Java's, and
    the meaning of no partitioner named) included; None where librdkafka would pick a
    partition of its own (no key, an empty key under a `_random` partitioner, `random`),
    which the caller then picks itself."""
    if key is None:
        return None
    rule = _KEYED.get(partitioner or "murmur2")
    return None if rule is None else rule(key, count)


def place(partitioner: str | None, key: bytes | None, count: int) -> int | None:
    """The partition of a record with `key` among `count` under `partitioner`, or None
    where the daemon's producer places it the same way (a record without a key, murmur2,
    random, no partitioner named)."""
    if partitioner is None or key is None:
        return None
    rule = _PLACES.get(partitioner)
    return None if rule is None else rule(key, count)
