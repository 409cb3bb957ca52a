"""The shapes of `cancel` and `reschedule`, written once for `DelayProducer` and
`AsyncDelayProducer`.

Each call returns a receipt without `wait` and the daemon's reply with it, and a type
checker should tell which from the call. The async producer returns the same things,
awaited, and its receipt is an awaitable one; a `ParamSpec` cannot carry overloads, so
the overloads are written here, over the two return types, and each producer names
its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

if TYPE_CHECKING:
    from delayservice.delay_timing import Delay, DeliverAt
    from delayservice.markers.receipt import DeliveryCallback

_Receipt_co = TypeVar("_Receipt_co", covariant=True)
_Reply_co = TypeVar("_Reply_co", covariant=True)
_Method = TypeVar("_Method", bound=Callable[..., Any])


def named(method: _Method, name: str) -> _Method:
    """`method`, under the public name its shape is given to (for `help()` and
    tracebacks): the implementation is written under another, since a method cannot
    be typed by a protocol in place."""
    method.__name__ = name
    method.__qualname__ = f"{method.__qualname__.rpartition('.')[0]}.{name}"
    return method


class CancelCall(Protocol[_Receipt_co, _Reply_co]):
    @overload
    def __call__(
        self, message_id: str, *, wait: None = None, on_delivery: DeliveryCallback | None = None
    ) -> _Receipt_co: ...

    @overload
    def __call__(
        self, message_id: str, *, wait: float, on_delivery: DeliveryCallback | None = None
    ) -> _Reply_co: ...

    @overload
    def __call__(
        self,
        message_id: str,
        *,
        wait: float | None,
        on_delivery: DeliveryCallback | None = None,
    ) -> _Receipt_co | _Reply_co: ...


class RescheduleCall(Protocol[_Receipt_co, _Reply_co]):
    @overload
    def __call__(
        self,
        message_id: str,
        *,
        delay: Delay | None = None,
        deliver_at: DeliverAt | None = None,
        wait: None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> _Receipt_co: ...

    @overload
    def __call__(
        self,
        message_id: str,
        *,
        delay: Delay | None = None,
        deliver_at: DeliverAt | None = None,
        wait: float,
        on_delivery: DeliveryCallback | None = None,
    ) -> _Reply_co: ...

    @overload
    def __call__(
        self,
        message_id: str,
        *,
        delay: Delay | None = None,
        deliver_at: DeliverAt | None = None,
        wait: float | None,
        on_delivery: DeliveryCallback | None = None,
    ) -> _Receipt_co | _Reply_co: ...
