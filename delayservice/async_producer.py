"""AsyncDelayProducer: `DelayProducer` for asyncio applications.

confluent-kafka ships `confluent_kafka.aio.AIOProducer`, but in the pinned 2.16 its
`produce()` refuses headers (`NotImplementedError`: it batches through
`produce_batch`, which cannot carry them), and the envelope travels in headers. So this
wraps the same `DelayProducer` instead: `produce()` hands the record to it on the event
loop's thread (it never waits for the broker: a record whose partition count is not
known yet waits in the producer), one thread polls for delivery reports, and each
report resolves its asyncio future with `call_soon_threadsafe`. Arguments and errors
are those of `DelayProducer`.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, overload

from confluent_kafka import KafkaError

from delayservice.delay_timing import Delay, DeliverAt
from delayservice.envelope import Headers
from delayservice.errors import DelayServiceError
from delayservice.levels import LevelSet
from delayservice.markers.receipt import DeliveryCallback, MarkerReceipt
from delayservice.producer import DelayProducer, Precision
from delayservice.settings import Settings

if TYPE_CHECKING:
    from delayservice.markers.replies import MarkerReply

POLL_S: Final = 0.1
"""How long the polling thread waits for a report at a time (and so to notice close)."""


class AsyncMarkerReceipt:
    """`MarkerReceipt` with awaitable waits, run off the event loop."""

    def __init__(self, receipt: MarkerReceipt) -> None:
        self.receipt = receipt
        self.kind = receipt.kind
        self.message_id = receipt.message_id

    async def landed(self, timeout: float = 30.0) -> tuple[str, int, int]:
        return await asyncio.to_thread(self.receipt.landed, timeout)

    async def reply(self, timeout: float = 30.0) -> MarkerReply:
        return await asyncio.to_thread(self.receipt.reply, timeout)


class AsyncDelayProducer:
    """`await produce(...)` returns the message id once the broker has the record (on the
    delay topic, or on `topic` when undelayed): the forward itself happens when due.
    Many sends at once: `asyncio.gather` them; librdkafka batches them as usual."""

    def __init__(
        self,
        config: dict[str, Any],
        *,
        settings: Settings | None = None,
        levels: LevelSet | None = None,
        precision: Precision = "level",
        config_file: Path | str | None = None,
    ) -> None:
        self.producer = DelayProducer(
            config,
            settings=settings,
            levels=levels,
            precision=precision,
            config_file=config_file,
        )
        self._closed = threading.Event()
        self._poller = threading.Thread(
            target=self._poll_reports, name="delayservice-async-poll", daemon=True
        )
        self._poller.start()

    def _poll_reports(self) -> None:
        while not self._closed.is_set():
            self.producer.poll(POLL_S)

    async def produce(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        partition: int = -1,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Headers | dict[str, str | bytes | None] | None = None,
        *,
        delay: Delay | None = None,
        deliver_at: DeliverAt | None = None,
        callback: DeliveryCallback | None = None,
        precision: Precision | None = None,
    ) -> str:
        """`DelayProducer.produce`, awaited until the broker acknowledges the write;
        raises `DelayServiceError` (with the Kafka code) when it refuses it."""
        loop = asyncio.get_running_loop()
        written: asyncio.Future[None] = loop.create_future()
        user_callback = on_delivery or callback

        def delivered(err: Any, msg: Any) -> None:  # on the polling thread
            try:
                if user_callback is not None:
                    user_callback(err, msg)
            finally:
                loop.call_soon_threadsafe(_settle, written, err)

        message_id = self.producer.produce(
            topic,
            value,
            key,
            partition,
            delivered,
            timestamp,
            headers,
            delay=delay,
            deliver_at=deliver_at,
            precision=precision,
        )
        await written
        return message_id

    @overload
    async def cancel(
        self, message_id: str, *, wait: None = None, on_delivery: DeliveryCallback | None = None
    ) -> AsyncMarkerReceipt: ...

    @overload
    async def cancel(
        self, message_id: str, *, wait: float, on_delivery: DeliveryCallback | None = None
    ) -> MarkerReply: ...

    async def cancel(
        self,
        message_id: str,
        *,
        wait: float | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> AsyncMarkerReceipt | MarkerReply:
        """`DelayProducer.cancel`: with `wait`, the daemon's reply; without, a receipt to
        await later."""
        call = functools.partial(
            self.producer.cancel, message_id, wait=wait, on_delivery=on_delivery
        )
        return _async(await asyncio.to_thread(call))

    @overload
    async def reschedule(
        self,
        message_id: str,
        *,
        delay: Delay | None = None,
        deliver_at: DeliverAt | None = None,
        wait: None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> AsyncMarkerReceipt: ...

    @overload
    async def reschedule(
        self,
        message_id: str,
        *,
        delay: Delay | None = None,
        deliver_at: DeliverAt | None = None,
        wait: float,
        on_delivery: DeliveryCallback | None = None,
    ) -> MarkerReply: ...

    async def reschedule(
        self,
        message_id: str,
        *,
        delay: Delay | None = None,
        deliver_at: DeliverAt | None = None,
        wait: float | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> AsyncMarkerReceipt | MarkerReply:
        """`DelayProducer.reschedule`: with `wait`, the daemon's reply; without, a
        receipt to await later."""
        call = functools.partial(
            self.producer.reschedule,
            message_id,
            delay=delay,
            deliver_at=deliver_at,
            wait=wait,
            on_delivery=on_delivery,
        )
        return _async(await asyncio.to_thread(call))

    async def flush(self, timeout: float = -1) -> int:
        return await asyncio.to_thread(self.producer.flush, timeout)

    async def close(self, timeout: float = 30.0) -> None:
        """Flush, then stop the polling thread; raises if records were left undelivered."""
        remaining = await self._close(timeout)
        if remaining:
            raise DelayServiceError(
                f"{remaining} messages were not delivered before close", retriable=True
            )

    async def _close(self, timeout: float) -> int:
        try:
            return await self.flush(timeout)
        finally:
            self._closed.set()
            await asyncio.to_thread(self._poller.join)

    def __len__(self) -> int:
        return len(self.producer)

    async def __aenter__(self) -> AsyncDelayProducer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            await self.close()
        else:
            await self._close(30.0)


def _settle(written: asyncio.Future[None], err: Any) -> None:
    if written.done():
        return  # the caller gave up waiting
    if err is None:
        written.set_result(None)
    elif isinstance(err, KafkaError):
        written.set_exception(DelayServiceError.from_kafka(err, "not delivered"))
    else:
        written.set_exception(DelayServiceError(f"not delivered: {err}"))


def _async(outcome: MarkerReceipt | MarkerReply) -> AsyncMarkerReceipt | MarkerReply:
    return AsyncMarkerReceipt(outcome) if isinstance(outcome, MarkerReceipt) else outcome
