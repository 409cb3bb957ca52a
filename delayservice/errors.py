"""One root exception for everything DelayService raises.

Callers that talk to Kafka need two facts to decide what to do with a failure: the
Kafka error code (when the broker or librdkafka produced one) and whether trying
again can help. Every error carries both, so retry loops never parse messages.
"""

from __future__ import annotations

from typing import Any


class DelayServiceError(Exception):
    """Root of all DelayService errors."""

    def __init__(self, message: str, *, code: int | None = None, retriable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retriable = retriable

    @classmethod
    def from_kafka(cls, kafka_error: Any, context: str) -> DelayServiceError:
        """Wrap a `confluent_kafka.KafkaError` without losing its code or retriability."""
        return cls(
            f"{context}: {kafka_error.str()}",
            code=kafka_error.code(),
            retriable=bool(kafka_error.retriable()),
        )


class ConfigError(DelayServiceError):
    """A setting is invalid. Start-up stops with one line naming it and exit code 2."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(f"invalid setting {setting}: {problem}")
        self.setting = setting


class DelayTooLongError(DelayServiceError, ValueError):
    """The requested delay is above the top level and the level policy cannot hold it."""


class EnvelopeError(DelayServiceError, ValueError):
    """A record on a delay topic has no valid envelope; it belongs on the dead-letter topic."""


class TopicSetupError(DelayServiceError):
    """The delay topics are missing or configured so that promises would break."""


class BrokerUnavailableError(DelayServiceError):
    """No broker answered what was asked (an outage, or a wrong address): nothing is
    known about the topics, so nothing here says to create one. Trying again can help."""

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message, code=code, retriable=True)


class RepliesUnavailableError(DelayServiceError):
    """The broker answered that the outcomes topic does not exist, so no reply to a
    cancel or reschedule can be waited for."""
