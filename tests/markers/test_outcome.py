"""The wait for a marker's reply: what its client raises reaches the application as the
SDK's own error, with the Kafka code and whether it is retriable."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from delayservice.errors import DelayServiceError
from delayservice.markers import outcome
from tests.level.fakes import raise_bare_kafka_error


class _Consumer:
    """Assigns, then fails its read the way confluent-kafka's `consume()` fails: a
    `KafkaException` carrying the error (`cfl_PyErr_Format`), or the `KafkaError`
    itself (`kafka.client_errors`)."""

    def __init__(self, error: KafkaError, *, bare: bool) -> None:
        self.error = error
        self.bare = bare
        self.assigned: list[Any] = []

    def assign(self, partitions: list[Any]) -> None:
        self.assigned = partitions

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        if self.bare:
            raise_bare_kafka_error(self.error)
            raise AssertionError("raise_bare_kafka_error raises")  # pragma: no cover
        raise KafkaException(self.error)


@pytest.mark.parametrize("bare", [False, True], ids=["KafkaException", "bare KafkaError"])
@pytest.mark.parametrize("retriable", [True, False])
def test_a_read_that_raises_gives_the_sdks_error_with_the_code(bare: bool, retriable: bool):
    error = KafkaError(KafkaError._TRANSPORT, "connection lost", retriable=retriable)
    consumer = _Consumer(error, bare=bare)
    with pytest.raises(DelayServiceError) as raised:
        outcome._first_reply(consumer, "outcomes", {0: 7}, b"key", timeout=5.0)  # type: ignore[arg-type]
    assert raised.value.code == KafkaError._TRANSPORT
    assert raised.value.retriable is retriable
    assert "reading outcomes" in str(raised.value)
    assert "connection lost" in str(raised.value)
    assert [(tp.topic, tp.partition, tp.offset) for tp in consumer.assigned] == [("outcomes", 0, 7)]


def test_an_assign_that_raises_gives_the_sdks_error():
    class _Refusing(_Consumer):
        def assign(self, partitions: list[Any]) -> None:
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG, "no such partition"))

    with pytest.raises(DelayServiceError) as raised:
        outcome._first_reply(
            _Refusing(KafkaError(KafkaError._TRANSPORT), bare=False),  # type: ignore[arg-type]
            "outcomes",
            {0: 0},
            b"key",
            timeout=5.0,
        )
    assert raised.value.code == KafkaError._INVALID_ARG
    assert raised.value.retriable is False
