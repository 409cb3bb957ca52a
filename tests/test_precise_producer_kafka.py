"""Exact messages and cancels on a real broker: what lands on the precise topic, where."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from delayservice.kafka import topics
from delayservice.producer import DelayProducer, precise_partition

pytestmark = pytest.mark.kafka

PARTITIONS = 3


def _precise_settings(testbed):
    settings = testbed.settings(
        levels="1s", precise=True, precise_topic=f"dp-{testbed.tag}", partitions=PARTITIONS
    )
    topics.create(testbed.admin, settings)

    def visible() -> bool:
        info = testbed.admin.list_topics(settings.precise_topic, timeout=5).topics.get(
            settings.precise_topic
        )
        return info is not None and info.error is None and len(info.partitions) == PARTITIONS

    testbed.wait_for(visible, 30, "the precise topic in the metadata")
    return settings


def test_exact_messages_and_a_cancel_land_on_the_partition_of_their_id(testbed):
    settings = _precise_settings(testbed)
    at = datetime.now(UTC) + timedelta(minutes=50)  # within precise_far_after (1 h)
    delivered = []
    with DelayProducer(
        {"bootstrap.servers": testbed.bootstrap}, settings=settings, precision="exact"
    ) as producer:
        ids = [
            producer.produce(
                "orders",
                f"v{n}".encode(),
                f"k{n}".encode(),
                headers=[("trace", f"t{n}".encode())],
                delay=timedelta(minutes=10 + n),
                on_delivery=lambda err, msg: delivered.append(err),
            )
            for n in range(12)
        ]
        at_id = producer.produce("orders", b"at", partition=1, deliver_at=at)
        producer.cancel(ids[0], on_delivery=lambda err, msg: delivered.append(err))
    assert delivered == [None] * 13

    records = testbed.collect(settings.precise_topic, 14)
    by_id = {}
    markers = []
    for record in records:
        headers = dict(record.headers())
        assert record.topic() == settings.precise_topic
        if "delay-cancel" in headers:
            markers.append(record)
        else:
            by_id[headers["delay-id"].decode()] = record
    assert set(by_id) == {*ids, at_id}
    assert len({r.partition() for r in by_id.values()}) > 1  # spread by id
    for mid, record in by_id.items():
        assert record.partition() == precise_partition(mid, PARTITIONS)

    for n, mid in enumerate(ids):
        record = by_id[mid]
        assert (record.key(), record.value()) == (f"k{n}".encode(), f"v{n}".encode())
        assert record.headers() == [
            ("trace", f"t{n}".encode()),
            ("delay-v", b"1"),
            ("delay-target", b"orders"),
            ("delay-ms", str((10 + n) * 60_000).encode()),
            ("delay-id", mid.encode()),
            ("delay-partitioner", b"consistent_random"),  # librdkafka's default
        ]
    at_headers = dict(by_id[at_id].headers())
    assert at_headers["delay-ms"] == b"0"
    assert at_headers["delay-due-ms"] == str(math.ceil(at.timestamp() * 1000)).encode()
    assert at_headers["delay-partition"] == b"1"

    (marker,) = markers
    assert marker.partition() == by_id[ids[0]].partition()
    assert marker.offset() > by_id[ids[0]].offset()
    assert (marker.key(), marker.value()) == (None, None)
    assert marker.headers() == [("delay-v", b"1"), ("delay-cancel", ids[0].encode())]


def test_an_exact_send_without_the_precise_topic_says_how_to_create_it(testbed):
    """produce() returns at once; the delivery callback says what to do, as librdkafka
    reports a record it cannot route."""
    from confluent_kafka import KafkaError

    settings = testbed.settings(levels="1s", precise_topic=f"nope-{testbed.tag}")
    producer = DelayProducer(
        {"bootstrap.servers": testbed.bootstrap, "allow.auto.create.topics": False},
        settings=settings,
    )
    reports = []
    producer.produce(
        "orders", b"v", delay=60, precision="exact", on_delivery=lambda e, m: reports.append(e)
    )
    assert producer.flush(30) == 0
    (error,) = reports
    assert error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert "topics create" in error.str()
    assert error.retriable()
    assert len(producer) == 0
