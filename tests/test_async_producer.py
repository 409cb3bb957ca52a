"""AsyncDelayProducer's arguments are DelayProducer's: one description of each call,
read by type checkers, by `help()` and at run time. No broker is needed here: with none
answering, librdkafka reports each record as timed out, which is what these check."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest
from confluent_kafka import KafkaError

from delayservice.async_producer import AsyncDelayProducer
from delayservice.errors import DelayServiceError
from delayservice.producer import DelayProducer
from tests.test_precise_producer import _settings

NO_BROKER = {"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 1000}


@pytest.mark.parametrize("name", ["__init__", "produce"])
def test_the_async_calls_show_the_sync_arguments(name: str) -> None:
    assert inspect.signature(getattr(AsyncDelayProducer, name)) == inspect.signature(
        getattr(DelayProducer, name)
    )


def test_an_unknown_argument_is_refused_as_the_sync_producer_refuses_it() -> None:
    with pytest.raises(TypeError, match="precisionn"):
        AsyncDelayProducer(NO_BROKER, precisionn="exact")  # type: ignore[call-arg]

    async def main() -> None:
        producer = AsyncDelayProducer(NO_BROKER, settings=_settings(partitions=3))
        try:
            with pytest.raises(TypeError, match="delayy"):
                await producer.produce("orders", b"v", delayy=2)  # type: ignore[call-arg]
        finally:
            await producer._close(1)
            producer.producer.close()

    asyncio.run(main())


@pytest.mark.parametrize("given", ["positional", "on_delivery", "callback"])
def test_the_callback_runs_once_with_the_report_however_it_was_given(given: str) -> None:
    """`on_delivery` may come as the fifth argument, by name, or as `callback`: each is
    called with librdkafka's report, and the send's future fails with the same code."""
    reports: list[Any] = []

    def report(err: Any, msg: Any) -> None:
        reports.append(err)

    async def main() -> DelayServiceError:
        producer = AsyncDelayProducer(NO_BROKER, settings=_settings(partitions=3))
        try:
            if given == "positional":
                send = producer.produce("orders", b"v", b"k", -1, report, delay=2)
            else:
                send = producer.produce("orders", b"v", b"k", delay=2, **{given: report})
            with pytest.raises(DelayServiceError) as caught:
                await asyncio.wait_for(send, 10)
            return caught.value
        finally:
            await producer._close(1)
            producer.producer.close()

    error = asyncio.run(main())
    assert error.code == KafkaError._MSG_TIMED_OUT
    assert [err.code() for err in reports] == [KafkaError._MSG_TIMED_OUT]
