"""The forwarder's fast paths call `Producer.produce` with every argument by position.

confluent-kafka names its arguments (topic, value, key, partition, callback,
on_delivery, timestamp, headers); if a release reordered them, a forward would still
be accepted and land with its headers or its partition wrong. This holds the order to
a real broker, on the client the daemon uses.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from delayservice.forward.sender import ANY_PARTITION


@pytest.mark.kafka
def test_positional_produce_keeps_value_key_partition_and_headers(
    testbed, unique_name: Callable[[str], str], java_partitions
) -> None:
    topic = testbed.create_topic(unique_name("positional"), partitions=4)
    producer = Producer({"bootstrap.servers": testbed.bootstrap, "partitioner": "murmur2_random"})
    headers = [("trace", b"abc"), ("delay-id", b"id-1"), ("delay-due-ms", b"1700000000000")]
    keys = [f"key-{n}" for n in range(20)]
    for key in keys:
        producer.produce(topic, b"v-" + key.encode(), key.encode(), ANY_PARTITION, None, None, 0,
                         list(headers))  # fmt: skip
    producer.produce(topic, b"pinned", b"key-0", 3, None, None, 0, [("only", None)])
    assert producer.flush(30) == 0

    records = testbed.collect(topic, len(keys) + 1)
    by_value = {r.value(): r for r in records}
    expected = java_partitions(keys, 4)
    for key in keys:
        record = by_value[b"v-" + key.encode()]
        assert record.key() == key.encode()
        assert record.headers() == headers
        assert record.partition() == expected[key]  # the key decided, as Java clients hash
    pinned = by_value[b"pinned"]
    assert pinned.partition() == 3
    assert pinned.headers() == [("only", None)]
