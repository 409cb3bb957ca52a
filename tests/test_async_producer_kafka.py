"""AsyncDelayProducer on a real broker with a real daemon: the same arguments as
DelayProducer, awaited until the broker has each record."""

from __future__ import annotations

import asyncio
import time

import pytest

from delayservice import AsyncDelayProducer, AsyncMarkerReceipt
from delayservice.errors import DelayServiceError, DelayTooLongError
from tests.precise.test_precise_daemon import _headers, _precise

pytestmark = pytest.mark.kafka


def test_async_sends_level_and_exact_messages_and_learns_what_a_cancel_did(testbed, tmp_path):
    settings = _precise(testbed, tmp_path, levels="1s,2s")
    target = testbed.create_topic(f"async-{testbed.tag}")
    daemon = testbed.start_daemon(settings)
    testbed.wait_assigned(daemon, partitions=settings.partitions)
    reports = []

    async def scenario() -> tuple[list[str], str, str, str]:
        config = {"bootstrap.servers": testbed.bootstrap, "linger.ms": 5}
        async with AsyncDelayProducer(config, settings=settings) as producer:
            level_ids = await asyncio.gather(
                *(
                    producer.produce(
                        target, f"l{n}".encode(), key=b"k", delay="2s",
                        on_delivery=lambda err, msg: reports.append(err),
                    )
                    for n in range(5)
                )
            )  # fmt: skip
            with pytest.raises(DelayTooLongError):
                await producer.produce(target, b"x", delay=60)
            with pytest.raises(ValueError, match="negative"):
                await producer.produce(target, b"x", delay=-1)
            exact = await producer.produce(target, b"e", delay=1.5, precision="exact")
            doomed = await producer.produce(target, b"d", delay=60, precision="exact")
            receipt = await producer.cancel(doomed)
            assert isinstance(receipt, AsyncMarkerReceipt)
            outcome = (await receipt.reply(30)).outcome
            again = await producer.cancel(doomed, wait=30)
            return level_ids, exact, outcome, again.outcome

    sent_at = time.time()
    level_ids, exact, outcome, again = asyncio.run(scenario())
    assert reports == [None] * 5, "every on_delivery ran, before its produce returned"
    assert outcome == "accepted"
    assert again == "accepted", "a second cancel of a cancelled message is accepted too"
    arrived = testbed.collect(target, 6, timeout=60)
    by_id = {_headers(r)["delay-id"].decode(): r for r in arrived}
    assert set(by_id) == {*level_ids, exact}
    for message_id in level_ids:
        assert by_id[message_id].timestamp()[1] >= sent_at * 1000 + 2000
    assert [by_id[i].value() for i in level_ids] == [f"l{n}".encode() for n in range(5)]


def test_an_async_send_the_broker_refuses_raises_with_its_kafka_code(testbed):
    from confluent_kafka import KafkaError

    settings = testbed.settings(levels="1s")

    async def scenario() -> None:
        config = {
            "bootstrap.servers": testbed.bootstrap,
            "allow.auto.create.topics": False,
            "message.timeout.ms": 3000,
        }
        async with AsyncDelayProducer(config, settings=settings) as producer:
            await producer.produce(f"missing-{testbed.tag}", b"v")

    with pytest.raises(DelayServiceError, match="not delivered") as caught:
        asyncio.run(scenario())
    assert caught.value.code in {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._MSG_TIMED_OUT,
    }
