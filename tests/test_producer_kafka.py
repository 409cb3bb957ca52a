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
