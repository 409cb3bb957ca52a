"""`consumer_fatal.fatal_error` on a real broker: a usable consumer is told nothing and
commits nothing; a static member fenced by another with its `group.instance.id` is
found fatal before its own queue has said so."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from delayservice.kafka.consumer_fatal import fatal_error

pytestmark = pytest.mark.kafka


def _member(testbed: Any, group: str, commits: list[Any]) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": testbed.bootstrap,
            "group.id": group,
            "group.instance.id": "same-instance",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 300,
            "on_commit": lambda error, partitions: commits.append(error),
        }
    )


def _assigned(consumer: Consumer, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not consumer.assignment():
        assert time.monotonic() < deadline, "never assigned"
        consumer.poll(0.2)


def test_a_usable_consumer_is_not_fatal_and_the_question_commits_nothing(testbed: Any) -> None:
    topic = testbed.create_topic(f"fatal-probe-{testbed.tag}", 2)
    commits: list[Any] = []
    consumer = _member(testbed, f"g-usable-{testbed.tag}", commits)
    try:
        consumer.subscribe([topic])
        _assigned(consumer)
        assert fatal_error(consumer, topic, 0) is None
        consumer.poll(0.5)  # a commit callback, had the probe made one, is served here
        assert commits == []
        (committed,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        assert committed.offset < 0  # nothing was committed
    finally:
        consumer.close()


def test_a_fenced_static_member_is_found_fatal_before_its_queue_says_so(testbed: Any) -> None:
    topic = testbed.create_topic(f"fatal-fenced-{testbed.tag}", 2)
    group = f"g-fenced-{testbed.tag}"
    fenced = _member(testbed, group, [])
    newer = _member(testbed, group, [])
    try:
        fenced.subscribe([topic])
        _assigned(fenced)
        newer.subscribe([topic])
        _assigned(newer)
        found: list[KafkaError] = []

        def fatal_found() -> bool:  # fenced at its next heartbeat, without a poll
            error = fatal_error(fenced, topic, 0)
            if error is not None:
                found.append(error)
            return bool(found)

        testbed.wait_for(fatal_found, 30, "the fenced member's fatal error")
        assert found[0].code() == KafkaError._FATAL
        message = fenced.poll(5.0)  # what its queue says, once served
        assert message is not None
        assert message.error() is not None
        assert message.error().code() == KafkaError._FATAL
    finally:
        fenced.close()
        newer.close()
