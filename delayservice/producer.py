"""DelayProducer: a drop-in for `confluent_kafka.Producer` that can delay a message.

The application keeps its librdkafka config and its `produce()` calls and adds
`delay=` or `deliver_at=`. A delayed message goes to the level topic its delay selects,
with the envelope in headers; an undelayed one goes straight to its topic. Levels come
from the same settings as the daemon, so both sides always agree.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from confluent_kafka import Producer

from delayservice.envelope import Envelope, Headers, new_id, wrap
from delayservice.errors import DelayServiceError
from delayservice.levels import LevelSet
from delayservice.settings import Settings, load_settings

DeliveryCallback = Callable[[Any, Any], None]


def delay_to_ms(delay: float | timedelta | None, deliver_at: datetime | float | None) -> int | None:
    """Milliseconds to wait, or None for no delay. Sub-millisecond delays round up."""
    if delay is not None and deliver_at is not None:
        raise ValueError("pass delay= or deliver_at=, not both")
    if delay is not None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    elif deliver_at is not None:
        if isinstance(deliver_at, datetime):
            if deliver_at.tzinfo is None:
                raise ValueError("deliver_at must be timezone-aware (e.g. datetime.now(UTC))")
            target = deliver_at.timestamp()
        else:
            target = float(deliver_at)
        seconds = target - time.time()
    else:
        return None
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"delay must be finite, got {seconds}")
    return math.ceil(seconds * 1000) if seconds > 0 else None


class DelayProducer:
    """Wraps a `confluent_kafka.Producer`; every attribute not defined here passes through."""

    def __init__(
        self,
        config: dict[str, Any],
        *,
        settings: Settings | None = None,
        levels: LevelSet | None = None,
    ) -> None:
        self.levels = levels or (settings or load_settings()).level_set()
        self._producer = Producer(config)

    def produce(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        partition: int = -1,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Headers | dict[str, str | bytes | None] | None = None,
        *,
        delay: float | timedelta | None = None,
        deliver_at: datetime | float | None = None,
        callback: DeliveryCallback | None = None,
    ) -> str:
        """Send now, or after `delay`; returns the message id (`delay-id`)."""
        on_delivery = on_delivery or callback
        message_id = new_id()
        kwargs: dict[str, Any] = {"timestamp": timestamp}
        if on_delivery is not None:
            kwargs["on_delivery"] = on_delivery
        delay_ms = delay_to_ms(delay, deliver_at)
        user_headers: Headers | None = (
            list(headers.items()) if isinstance(headers, dict) else headers
        )
        if delay_ms is None:
            if partition >= 0:
                kwargs["partition"] = partition
            self._producer.produce(topic, value, key, headers=user_headers, **kwargs)
            return message_id
        level = self.levels.select(delay_ms)
        envelope = Envelope(topic, delay_ms, message_id, partition if partition >= 0 else None)
        self._producer.produce(
            level.topic, value, key, headers=wrap(envelope, user_headers), **kwargs
        )
        return message_id

    def poll(self, timeout: float = 0) -> int:
        return int(self._producer.poll(timeout))

    def flush(self, timeout: float = -1) -> int:
        return int(self._producer.flush(timeout))

    def __len__(self) -> int:
        return len(self._producer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def __enter__(self) -> DelayProducer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        remaining = self.flush(30)
        if remaining and exc_type is None:
            raise DelayServiceError(
                f"{remaining} messages were not delivered before close", retriable=True
            )
