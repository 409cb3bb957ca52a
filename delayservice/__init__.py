"""DelayService: delayed delivery for Apache Kafka without touching the broker."""

from typing import TYPE_CHECKING, Any

from delayservice.async_producer import AsyncDelayProducer, AsyncMarkerReceipt
from delayservice.errors import (
    BrokerUnavailableError,
    ConfigError,
    DelayServiceError,
    DelayTooLongError,
    EnvelopeError,
    RepliesUnavailableError,
    TopicSetupError,
)
from delayservice.markers.receipt import MarkerNotDeliveredError, MarkerReceipt, NoReplyError
from delayservice.producer import DelayProducer

if TYPE_CHECKING:
    from delayservice.markers.replies import MarkerReply

__version__ = "0.1.0"
__all__ = [
    "AsyncDelayProducer",
    "AsyncMarkerReceipt",
    "BrokerUnavailableError",
    "ConfigError",
    "DelayProducer",
    "DelayServiceError",
    "DelayTooLongError",
    "EnvelopeError",
    "MarkerNotDeliveredError",
    "MarkerReceipt",
    "MarkerReply",
    "NoReplyError",
    "RepliesUnavailableError",
    "TopicSetupError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """`MarkerReply` on first use: importing the package stays clear of the Kafka tooling
    its module brings in (settings are read before any client exists)."""
    if name == "MarkerReply":
        from delayservice.markers.replies import MarkerReply

        return MarkerReply
    raise AttributeError(f"module 'delayservice' has no attribute {name!r}")
