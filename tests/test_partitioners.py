"""The partitioners the daemon places keyed forwards with (`delayservice.partitioners`);
`tests/test_producer_kafka.py` holds them to librdkafka itself on a real broker."""

from __future__ import annotations

import zlib

import pytest

from delayservice.partitioners import DEFAULT, NAMES, fnv1a, keyed_partition, murmur2, place

# librdkafka's own unit test vectors for rd_fnv1a (src/rdfnv1a.c, from Go's hash/fnv).
FNV1A_VECTORS = {
    b"kafka": 0x0D33C4E1,
    b"giberish123456789": 0x77A58295,
    b"1234": 0x023BDD03,
    b"234": 0x2DEA3CD2,
    b"34": 0x740FA83E,
    b"4": 0x310CA263,
    b"PreAmbleWillBeRemoved,ThePrePartThatIs": 0x65CBD69C,
    b"reAmbleWillBeRemoved,ThePrePartThatIs": 0x6E49C79A,
    b"eAmbleWillBeRemoved,ThePrePartThatIs": 0x69EED356,
    b"AmbleWillBeRemoved,ThePrePartThatIs": 0x6ABCC023,
    b"": 0x7EE3623B,
}


@pytest.mark.parametrize(("key", "expected"), sorted(FNV1A_VECTORS.items()))
def test_fnv1a_is_librdkafkas(key, expected):
    assert fnv1a(key) == expected


def test_each_partitioner_places_a_keyed_record_as_librdkafka_defines_it():
    key = b"order-42"
    assert place("consistent_random", key, 6) == zlib.crc32(key) % 6
    assert place("consistent", key, 6) == zlib.crc32(key) % 6
    assert place("fnv1a", key, 6) == place("fnv1a_random", key, 6) == fnv1a(key) % 6
    # The daemon's own producer already hashes with murmur2, Java's; random is random.
    for name in ("murmur2", "murmur2_random", "random"):
        assert place(name, key, 6) is None


def test_records_without_a_key_or_a_partitioner_are_left_to_the_daemons_producer():
    for name in NAMES:
        assert place(name, None, 6) is None  # librdkafka's sticky partition
    assert place(None, b"k", 6) is None  # no envelope field: murmur2, as a Java producer
    assert place("consistent_random", b"", 6) is None  # an empty key: sticky too
    assert place("consistent", b"", 6) == 0  # CRC32 of nothing
    assert DEFAULT in NAMES


# Apache Kafka's own vectors for Utils.murmur2 (clients UtilsTest.testMurmur2).
MURMUR2_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("key", "expected"), sorted(MURMUR2_VECTORS.items()))
def test_murmur2_is_kafkas(key, expected):
    assert murmur2(key) == expected


def test_keyed_partition_places_keys_as_the_java_client_does(java_partitions):
    """murmur2 (and no partitioner named) hashes as Apache Kafka's Java producer does,
    computed by that producer's own code."""
    keys = ["", "a", "ab", "abc", "order-42", "ключ", "x" * 33, *[f"k{i}" for i in range(40)]]
    for count in (1, 3, 7, 12):
        java = java_partitions(keys, count)
        for key in keys:
            raw = key.encode()
            assert keyed_partition("murmur2_random", raw, count) == java[key], (key, count)
            assert keyed_partition("murmur2", raw, count) == java[key]
            assert keyed_partition(None, raw, count) == java[key]


def test_keyed_partition_leaves_to_the_caller_what_librdkafka_picks_itself():
    assert keyed_partition("consistent_random", b"k", 6) == zlib.crc32(b"k") % 6
    assert keyed_partition("fnv1a", b"k", 6) == fnv1a(b"k") % 6
    assert keyed_partition("consistent_random", b"", 6) is None  # random for an empty key
    assert keyed_partition("random", b"k", 6) is None
    for name in NAMES:
        assert keyed_partition(name, None, 6) is None  # no key: sticky
