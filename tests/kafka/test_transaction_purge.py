"""What librdkafka reports for records an abort takes back, on a real broker: the fake
producer of `tests/level/fakes.py` serves the same reports from `abort_transaction`,
and `OpenInterval` drops them with the interval they belong to."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = pytest.mark.kafka


def test_an_abort_reports_every_record_still_queued_as_purged_before_it_returns(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("purged")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "transactional.id": unique_name("purging"),
            "linger.ms": 10_000,  # nothing leaves the queue during the test
        }
    )
    reports: list[int | None] = []

    def on_delivery(error: KafkaError | None, _message: Message) -> None:
        reports.append(None if error is None else error.code())

    producer.init_transactions(30)
    producer.begin_transaction()
    for _ in range(3):
        producer.produce(topic, b"queued", on_delivery=on_delivery)
    producer.abort_transaction(30)
    assert reports == [KafkaError._PURGE_QUEUE] * 3
    producer.begin_transaction()
    producer.produce(topic, b"sent", on_delivery=on_delivery)
    assert producer.flush(30) == 0
    producer.commit_transaction(30)
    assert reports[3:] == [None]  # the next transaction's records owe the purge nothing
