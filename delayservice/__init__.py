"""DelayService: delayed delivery for Apache Kafka without touching the broker."""

from delayservice.errors import DelayServiceError
from delayservice.producer import DelayProducer

__version__ = "0.1.0"
__all__ = ["DelayProducer", "DelayServiceError", "__version__"]
