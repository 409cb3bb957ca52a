"""DelayProducer's level messages and their markers, against the fake wrapped producer:
where a level message goes, what its id names, and where its cancel and reschedule go."""

from __future__ import annotations

import zlib

import pytest
from confluent_kafka import KafkaError, KafkaException

from delayservice import producer as producer_module
from delayservice.errors import BrokerUnavailableError, DelayTooLongError
from delayservice.markers.level_ids import level_id, level_place, marker_partition
from delayservice.markers.outcome import RepliesUnavailableError
from delayservice.markers.topic_partitions import TopicPartitions
from delayservice.partitioners import murmur2
from delayservice.producer import DelayProducer
from tests.test_precise_producer import PARTITIONS, FakeProducer, _settings, in_line

MARKERS = "dmarkers"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeProducer:
    wrapped = FakeProducer()
    monkeypatch.setattr(producer_module, "Producer", lambda _config: wrapped)
    in_line(monkeypatch)
    return wrapped


def _producer(config: dict[str, str] | None = None) -> DelayProducer:
    return DelayProducer(config or {}, settings=_settings(markers_topic=MARKERS))


def test_a_keyed_level_message_goes_where_its_partitioner_puts_the_key_and_its_id_says_so(fake):
    crc, java = _producer(), _producer({"partitioner": "murmur2_random"})
    for producer, place in (
        (crc, lambda key: zlib.crc32(key) % PARTITIONS),
        (java, lambda key: (murmur2(key) & 0x7FFFFFFF) % PARTITIONS),
    ):
        for key in (b"order-1", b"order-2", "order-3"):
            mid = producer.produce("orders", b"v", key, delay=2)
            record = fake.sent[-1]
            raw = key.encode() if isinstance(key, str) else key
            assert record.topic == "lv-2"
            assert record.partition == place(raw)
            found = level_place(mid)
            assert found is not None
            assert (found.level, found.partition) == (2, record.partition)


def test_messages_without_a_key_stay_on_one_partition_for_a_while(fake):
    producer = _producer()
    for _ in range(20):
        producer.produce("orders", b"v", delay=1)
    assert len({r.partition for r in fake.sent}) == 1
    assert all(0 <= r.partition < PARTITIONS for r in fake.sent)


def test_a_level_cancel_goes_to_the_markers_topic_after_the_message_is_acknowledged(fake):
    producer = _producer()
    mid = producer.produce("orders", b"v", b"k", delay=1)
    flushed: list[int] = []
    fake.flush = lambda timeout=-1: flushed.append(len(fake.sent)) or 0
    producer.cancel(mid)
    marker = fake.sent[-1]
    assert flushed == [1], "the message in flight was flushed before the marker was sent"
    assert marker.topic == MARKERS
    place = level_place(mid)
    assert place is not None
    assert marker.partition == place.partition % PARTITIONS, (
        "the markers partition of its level partition"
    )
    assert (marker.key, marker.value) == (None, None)
    assert marker.headers == [("delay-v", b"1"), ("delay-cancel", mid.encode())]


@pytest.mark.parametrize("markers", [1, 2, 3, 7])
def test_a_level_marker_goes_to_the_markers_partition_of_its_level_partition(markers):
    """Level partition p's markers all go to p modulo the markers count, whatever the
    rest of the id: a flood on one holds back only that one's records."""
    for partition in range(12):
        homes = {marker_partition(level_id(level, partition), markers) for level in (1, 2, 3)}
        assert homes == {partition % markers}
    old = "0123456789abcdef0123456789abcdef"  # the ids before ids named their place
    assert marker_partition(old, markers) == zlib.crc32(old.encode()) % markers


def test_a_level_reschedule_beyond_the_top_level_is_refused_before_anything_is_sent(fake):
    producer = _producer()
    mid = producer.produce("orders", b"v", b"k", delay=1)
    with pytest.raises(DelayTooLongError, match=r"above the top level \(2s\); add a longer level"):
        producer.reschedule(mid, delay=3)
    producer.reschedule(mid, delay=1.5)
    marker = fake.sent[-1]
    assert marker.topic == MARKERS
    assert dict(marker.headers)["delay-ms"] == b"1500"


def test_an_id_of_the_old_form_goes_to_the_markers_topic_where_it_is_answered_unmatched(fake):
    producer = _producer()
    producer.cancel("3f0c6be1a7d84b6e9d9c2a51e0f7d312")
    assert fake.sent[-1].topic == MARKERS


def test_an_outage_on_a_waited_cancel_is_retriable_and_names_the_brokers_not_a_setup_step(fake):
    """No broker answers the metadata request for the outcomes topic: that says nothing
    about the topic, so the error must not send an operator to `topics create`."""
    fake.failure = KafkaException(
        KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: Local: Broker transport failure")
    )
    producer = _producer({"bootstrap.servers": "10.0.0.9:9092"})
    with pytest.raises(BrokerUnavailableError) as caught:
        producer.cancel("abc", wait=5)
    error = caught.value
    assert error.retriable
    assert error.code == KafkaError._TRANSPORT
    assert "10.0.0.9:9092" in str(error)
    assert f"partitions of {MARKERS}_outcomes" in str(error)
    assert "create" not in str(error)
    assert fake.sent == []


def test_a_waited_cancel_says_create_it_only_when_the_broker_says_the_topic_is_missing(fake):
    fake.topic_error = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
    with pytest.raises(RepliesUnavailableError, match="does not exist; create it with"):
        _producer().cancel("abc", wait=5)
    partitions = TopicPartitions(fake)
    assert partitions.missing("t")
    fake.topic_error = KafkaError(KafkaError.LEADER_NOT_AVAILABLE)  # exists, no leader yet
    assert not partitions.missing("t")
    fake.topic_error = None
    fake.failure = KafkaException(KafkaError(KafkaError._TIMED_OUT))
    with pytest.raises(BrokerUnavailableError):
        partitions.missing("t")


@pytest.mark.parametrize(
    ("config", "recorded"),
    [
        ({"default.topic.config": {"partitioner": "murmur2_random"}}, b"murmur2_random"),
        ({"partitioner": "fnv1a", "default.topic.config": {"partitioner": "murmur2"}}, b"fnv1a"),
        ({}, b"consistent_random"),
    ],
)
def test_the_envelope_records_the_partitioner_the_config_sets_nested_or_not(fake, config, recorded):
    """confluent-kafka still honours the deprecated `default.topic.config` dict, so a
    partitioner set there places undelayed sends; the forward must follow the same one."""
    producer = _producer(config)
    producer.produce("orders", b"v", b"key-1", delay=1)
    assert dict(fake.sent[-1].headers)["delay-partitioner"] == recorded
