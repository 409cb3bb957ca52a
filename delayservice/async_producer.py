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
import inspect
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, Final, ParamSpec, TypeVar, cast

from confluent_kafka import KafkaError

from delayservice.errors import DelayServiceError
from delayservice.marker_calls import CancelCall, RescheduleCall, named
from delayservice.markers.receipt import MarkerReceipt
from delayservice.producer import DelayProducer

if TYPE_CHECKING:
    from delayservice.markers.replies import MarkerReply

POLL_S: Final = 0.1
"""How long the polling thread waits for a report at a time (and so to notice close)."""

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _arguments_of(
    sync: Callable[Concatenate[Any, _P], object],
) -> Callable[[Callable[..., _R]], Callable[Concatenate[Any, _P], _R]]:
    """Give a wrapper the arguments of `DelayProducer`'s method, so there is one
    description of each call: type checkers read it from the sync method, `help()` and
    `inspect.signature` follow `__wrapped__` to it. (A type checker reads only the first
    overload through a ParamSpec: `cancel` and `reschedule` take their shapes from
    `marker_calls` instead.)"""

    def borrow(wrapper: Callable[..., _R]) -> Callable[Concatenate[Any, _P], _R]:
        return functools.wraps(sync, assigned=(), updated=())(wrapper)

    return borrow


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

    @_arguments_of(DelayProducer.__init__)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.producer = DelayProducer(*args, **kwargs)
        self._closed = threading.Event()
        self._poller = threading.Thread(
            target=self._poll_reports, name="delayservice-async-poll", daemon=True
        )
        self._poller.start()

    def _poll_reports(self) -> None:
        while not self._closed.is_set():
            self.producer.poll(POLL_S)

    @_arguments_of(DelayProducer.produce)
    async def produce(self, *args: Any, **kwargs: Any) -> str:
        """`DelayProducer.produce`, awaited until the broker acknowledges the write;
        raises `DelayServiceError` (with the Kafka code) when it refuses it."""
        loop = asyncio.get_running_loop()
        written: asyncio.Future[None] = loop.create_future()
        at = _on_delivery_position()
        positional = len(args) > at
        callback = kwargs.pop("callback", None)
        user_callback = (args[at] if positional else kwargs.pop("on_delivery", None)) or callback

        def delivered(err: Any, msg: Any) -> None:  # on the polling thread
            try:
                if user_callback is not None:
                    user_callback(err, msg)
            finally:
                loop.call_soon_threadsafe(_settle, written, err)

        if positional:
            args = (*args[:at], delivered, *args[at + 1 :])
        else:
            kwargs["on_delivery"] = delivered
        message_id = self.producer.produce(*args, **kwargs)
        await written
        return message_id

    @_arguments_of(DelayProducer.cancel)
    async def _cancel(self, *args: Any, **kwargs: Any) -> AsyncMarkerReceipt | MarkerReply:
        """`DelayProducer.cancel`: with `wait`, the daemon's reply; without, a receipt to
        await later."""
        return await _marker(self.producer.cancel, *args, **kwargs)

    cancel = cast(
        "CancelCall[Awaitable[AsyncMarkerReceipt], Awaitable[MarkerReply]]",
        named(_cancel, "cancel"),
    )

    @_arguments_of(DelayProducer.reschedule)
    async def _reschedule(self, *args: Any, **kwargs: Any) -> AsyncMarkerReceipt | MarkerReply:
        """`DelayProducer.reschedule`: with `wait`, the daemon's reply; without, a
        receipt to await later."""
        return await _marker(self.producer.reschedule, *args, **kwargs)

    reschedule = cast(
        "RescheduleCall[Awaitable[AsyncMarkerReceipt], Awaitable[MarkerReply]]",
        named(_reschedule, "reschedule"),
    )

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


async def _marker(
    send: Callable[..., MarkerReceipt | MarkerReply], *args: Any, **kwargs: Any
) -> AsyncMarkerReceipt | MarkerReply:
    """A cancel or reschedule off the event loop (it may wait for the reply)."""
    outcome = await asyncio.to_thread(send, *args, **kwargs)
    return AsyncMarkerReceipt(outcome) if isinstance(outcome, MarkerReceipt) else outcome


@functools.cache
def _on_delivery_position() -> int:
    """Where `on_delivery` stands among `produce`'s positional arguments (after self),
    read once from its signature: binding every call would cost more than the send."""
    return list(inspect.signature(DelayProducer.produce).parameters).index("on_delivery") - 1
