"""What a type checker tells an application of the SDK's marker calls: checked by mypy
(`pyproject.toml` lists this file), never run. A receipt without `wait`, the reply
with it, both when `wait` may be either; the async producer's, awaited."""

from __future__ import annotations

from typing import assert_type

from delayservice.async_producer import AsyncDelayProducer, AsyncMarkerReceipt
from delayservice.markers.receipt import MarkerReceipt
from delayservice.markers.replies import MarkerReply
from delayservice.producer import DelayProducer


def sync_calls(producer: DelayProducer, wait: float | None) -> None:
    assert_type(producer.cancel("id"), MarkerReceipt)
    assert_type(producer.cancel("id", wait=5.0), MarkerReply)
    assert_type(producer.cancel("id", wait=wait), MarkerReceipt | MarkerReply)
    assert_type(producer.reschedule("id", delay=1.0), MarkerReceipt)
    assert_type(producer.reschedule("id", deliver_at=1.0, wait=5.0), MarkerReply)
    assert_type(producer.reschedule("id", delay=1.0, wait=wait), MarkerReceipt | MarkerReply)


async def async_calls(producer: AsyncDelayProducer, wait: float | None) -> None:
    assert_type(await producer.cancel("id"), AsyncMarkerReceipt)
    assert_type(await producer.cancel("id", wait=5.0), MarkerReply)
    assert_type(await producer.cancel("id", wait=wait), AsyncMarkerReceipt | MarkerReply)
    assert_type(await producer.reschedule("id", delay=1.0), AsyncMarkerReceipt)
    assert_type(await producer.reschedule("id", deliver_at=1.0, wait=5.0), MarkerReply)
    reply = await producer.reschedule("id", delay=1.0, wait=wait)
    assert_type(reply, AsyncMarkerReceipt | MarkerReply)
