"""DelayService: delayed delivery for Apache Kafka without touching the broker."""

from delayservice.async_producer import AsyncDelayProducer, AsyncMarkerReceipt
from delayservice.errors import DelayServiceError, DelayTooLongError
from delayservice.marker_receipt import MarkerNotDeliveredError, MarkerReceipt, NoReplyError
from delayservice.precise.marker_replies import MarkerReply
from delayservice.producer import DelayProducer

__version__ = "0.1.0"
__all__ = [
    "AsyncDelayProducer",
    "AsyncMarkerReceipt",
    "DelayProducer",
    "DelayServiceError",
    "DelayTooLongError",
    "MarkerNotDeliveredError",
    "MarkerReceipt",
    "MarkerReply",
    "NoReplyError",
    "__version__",
]
