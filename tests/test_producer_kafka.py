from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from delayservice.errors import DelayTooLongError
from delayservice.levels import LevelSet

pytestmark = pytest.mark.kafka


def test_a_delayed_message_lands_on_its_level_topic_with_the_envelope(testbed):
    settings = testbed.settings(levels="1s,2s,3s")
    testbed.create_delay_topics(settings)
    delivered = []
    with testbed.producer(settings) as producer:
        mid = producer.produce(
            "orders",
            b"v",
            key=b"k",
            headers=[("trace", b"t")],
            partition=1,
            on_delivery=lambda err, msg: delivered.append(err),
            delay=timedelta(seconds=1.5),
        )
        at_id = producer.produce(
            "orders", b"w", deliver_at=datetime.now(UTC) + timedelta(seconds=2.5)
        )
        # produce() only queues: both records wait (and no delivery callback has run)
        # until leaving the block flushes them.
        assert len(producer) == 2
        assert delivered == []
    assert len(producer) == 0
    assert delivered == [None]
    (record,) = testbed.collect(f"{settings.topic_prefix}2", 1)
    headers = dict(record.headers())
    assert (record.key(), record.value()) == (b"k", b"v")
    assert headers["trace"] == b"t"
    assert headers["delay-target"] == b"orders"
    assert headers["delay-ms"] == b"1500"
    assert headers["delay-partition"] == b"1"
    assert headers["delay-id"].decode() == mid
    (later,) = testbed.collect(f"{settings.topic_prefix}3", 1)
    assert dict(later.headers())["delay-id"].decode() == at_id


def test_too_long_a_delay_is_refused_before_anything_is_sent(testbed):
    producer = testbed.producer(testbed.settings(levels="1s,2s"))
    with pytest.raises(DelayTooLongError):
        producer.produce("orders", b"v", delay=5)
    assert len(producer) == 0


def test_the_wrapper_takes_levels_directly(kafka_bootstrap):
    from delayservice.producer import DelayProducer

    producer = DelayProducer({"bootstrap.servers": kafka_bootstrap}, levels=LevelSet.parse("1m"))
    assert producer.levels.select(1).topic == "delay_topic_1"


TOTAL = 20_000
"""About half a second of sends: the first metadata answer comes in among them."""


def test_records_sent_before_the_count_is_known_land_where_their_ids_say_in_key_order(testbed):
    """Sent from the moment the producer is made, across its first metadata answer: each
    record sent before it waits for the level topic's count, then lands on the
    partition its id names (where its key goes), and each key's records keep the order
    they were sent in, those sent after the answer included. Idempotent, as a producer
    that needs a key's order must be: without it librdkafka may retry a batch behind
    later ones (seen here on the first batches of a fresh producer before this change
    too: 3 runs of 6 had a key out of order)."""
    from collections import defaultdict

    from delayservice import partitioners
    from delayservice.markers.level_ids import level_place
    from delayservice.producer import DelayProducer

    settings = testbed.settings(levels="1s")
    testbed.create_delay_topics(settings)
    config = {"bootstrap.servers": testbed.bootstrap, "linger.ms": 5, "enable.idempotence": True}
    producer = DelayProducer(config, settings=settings)
    mids = [producer.produce("orders", b"0", key=b"key-0", delay=1)]
    assert len(producer._held) == 1  # no answer can have come in the microseconds since
    mids += [
        producer.produce("orders", str(seq).encode(), key=f"key-{seq % 7}".encode(), delay=1)
        for seq in range(1, TOTAL)
    ]
    assert producer.flush(30) == 0
    per_key: dict[bytes, list[int]] = defaultdict(list)
    for record in testbed.collect(f"{settings.topic_prefix}1", TOTAL):
        place = level_place(dict(record.headers())["delay-id"].decode())
        assert place is not None
        assert record.partition() == place.partition
        assert record.partition() == partitioners.keyed_partition(
            partitioners.DEFAULT, record.key(), settings.partitions
        )
        per_key[record.key()].append(int(record.value()))
    assert sorted(v for values in per_key.values() for v in values) == list(range(TOTAL))
    for key, values in per_key.items():
        assert values == sorted(values), f"{key!r} out of order"
    assert {level_place(m).partition for m in mids} == {  # type: ignore[union-attr]
        partitioners.keyed_partition(partitioners.DEFAULT, f"key-{k}".encode(), 3) for k in range(7)
    }
