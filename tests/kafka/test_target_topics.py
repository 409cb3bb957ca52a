"""Partition counts of target topics, when the broker cannot be asked."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from delayservice.errors import DelayServiceError
from delayservice.kafka.target_topics import TargetTopics
from tests.level.fakes import FakeClock


class Unreachable:
    """A client whose metadata requests fail as librdkafka's do with no broker, until
    `reachable`; it counts what it was asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.reachable = False

    def list_topics(self, topic: str, timeout: float) -> SimpleNamespace:
        self.asked.append(topic)
        if not self.reachable:
            raise KafkaException(
                KafkaError(KafkaError._TRANSPORT, "Broker transport failure", retriable=True)
            )
        partitions = {0: None, 1: None}
        return SimpleNamespace(topics={topic: SimpleNamespace(partitions=partitions, error=None)})


def test_an_unreachable_broker_is_asked_once_per_hold_not_once_per_target():
    clock = FakeClock()
    client = Unreachable()
    targets = TargetTopics(client, unreachable_hold_s=1.0, clock=clock)
    for name in ("orders", "orders", "payments", "refunds"):
        with pytest.raises(DelayServiceError) as caught:
            targets.partitions(name)
        assert caught.value.retriable
        assert caught.value.code == KafkaError._TRANSPORT
        assert f"metadata for {name}" in str(caught.value)
    assert client.asked == ["orders"]  # each call would have waited out the timeout
    clock.advance(1.0)
    client.reachable = True
    assert targets.partitions("payments") == 2  # asked again once the hold is over
    assert client.asked == ["orders", "payments"]
