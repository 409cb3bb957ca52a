"""The callbacks a `ConsumerKeeper` hands its client never raise: librdkafka serves them
inside consume(), where an exception drops the batch the call fetched and leaves the
client unable to be destroyed (docs/faults.md, row 33)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, TopicPartition

from delayservice.kafka.consumer_keeper import ConsumerKeeper
from tests.level.fakes import raise_bare_kafka_error


def _bare_kafka_error(*_: Any) -> None:
    raise_bare_kafka_error(KafkaError(KafkaError._TRANSPORT, "a bare KafkaError"))


def _runtime_error(*_: Any) -> None:
    raise RuntimeError("a handler failed")


@pytest.mark.parametrize("handler", [_runtime_error, _bare_kafka_error])
def test_a_handler_that_raises_is_logged_never_raised_into_the_client(
    handler: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    handed: list[dict[str, Any]] = []

    def make(callbacks: dict[str, Any]) -> Any:
        handed.append(callbacks)
        return object()

    ConsumerKeeper("kept", make, handler, handler, lambda _why: None)
    (callbacks,) = handed
    caplog.set_level(logging.ERROR, logger="delayservice.kafka.consumer_keeper")
    callbacks["error_cb"](KafkaError(KafkaError._TRANSPORT, "broker down"))
    callbacks["on_commit"](None, [TopicPartition("t", 0, 1)])
    assert [r.getMessage() for r in caplog.records] == [
        "kept: handling an error the client reported failed",
        "kept: handling a commit the client reported failed",
    ]
