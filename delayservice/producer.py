"""DelayProducer: a drop-in for `confluent_kafka.Producer` that can delay a message.

The application keeps its librdkafka config and its `produce()` calls and adds
`delay=` or `deliver_at=`. A delayed message goes to the level topic its delay selects,
with the envelope in headers; an undelayed one goes straight to its topic. Levels come
from the same settings as the daemon, so both sides always agree.

With `precision="exact"` a delayed message goes instead to a precise topic, where the
precise-mode daemon forwards it at exactly its due time (any delay up to `max_delay`):
the precise topic up to `precise_far_after`, the far topic beyond, so that far-future
messages are read by an intake of their own. `cancel()` can withdraw it and
`reschedule()` move it before then. An exact message's id names the topic and the
partition it was sent to (`ids.precise_id`), and its markers go there, so the instances
holding the message read them however many partitions the topic has gained since.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Final, Literal

from confluent_kafka import Producer

from delayservice.envelope import (
    H_CANCEL,
    H_DELAY_MS,
    H_DUE_MS,
    H_RESCHEDULE,
    H_VERSION,
    VERSION,
    Envelope,
    Headers,
    new_id,
    wrap,
)
from delayservice.errors import DelayServiceError, DelayTooLongError
from delayservice.levels import LevelSet, format_duration_ms
from delayservice.precise.ids import named_place, precise_id, precise_partition
from delayservice.precise.topic_partitions import TopicPartitions
from delayservice.settings import Settings, load_settings

DeliveryCallback = Callable[[Any, Any], None]
Precision = Literal["level", "exact"]
"""`level`: the smallest level at least as long as the delay (the default). `exact`: the
precise topic, delivered at the requested time."""
PRECISIONS: Final = ("level", "exact")


def _epoch_seconds(deliver_at: datetime | float) -> float:
    if isinstance(deliver_at, datetime):
        if deliver_at.tzinfo is None:
            raise ValueError("deliver_at must be timezone-aware (e.g. datetime.now(UTC))")
        return deliver_at.timestamp()
    return float(deliver_at)


def delay_to_ms(delay: float | timedelta | None, deliver_at: datetime | float | None) -> int | None:
    """Milliseconds to wait, or None for no delay. Sub-millisecond delays round up."""
    if delay is not None and deliver_at is not None:
        raise ValueError("pass delay= or deliver_at=, not both")
    if delay is not None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    elif deliver_at is not None:
        seconds = _epoch_seconds(deliver_at) - time.time()
    else:
        return None
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"delay must be finite, got {seconds}")
    return math.ceil(seconds * 1000) if seconds > 0 else None


def exact_timing(
    delay: float | timedelta | None,
    deliver_at: datetime | float | None,
    max_delay_ms: int,
) -> tuple[int, int | None] | None:
    """`(delay-ms, delay-due-ms)` of an exact message, or None to send it undelayed.

    A relative delay travels as `delay-ms`, counted by the daemon from the broker's
    append time. An absolute time travels as `delay-due-ms` with `delay-ms` 0: the
    daemon's due time is max(append time + delay-ms, delay-due-ms), so time spent
    sending cannot shift it later. Both round up, so rounding never makes it early.
    """
    if delay is not None and deliver_at is not None:
        raise ValueError("pass delay= or deliver_at=, not both")
    limit = format_duration_ms(max_delay_ms)
    if deliver_at is None:
        delay_ms = delay_to_ms(delay, None)
        if delay_ms is None:
            return None
        if delay_ms > max_delay_ms:
            raise DelayTooLongError(
                f"delay of {delay_ms} ms is above max_delay ({limit}); "
                "raise max_delay or shorten the delay"
            )
        return delay_ms, None
    target = _epoch_seconds(deliver_at)
    if not math.isfinite(target):
        raise ValueError(f"deliver_at must be finite, got {target}")
    due_ms = math.ceil(target * 1000)
    ahead_ms = due_ms - time.time() * 1000
    if ahead_ms <= 0:
        return None
    if ahead_ms > max_delay_ms:
        raise DelayTooLongError(
            f"deliver_at is {math.ceil(ahead_ms)} ms ahead, above max_delay ({limit}); "
            "raise max_delay or deliver sooner"
        )
    return 0, due_ms


def _check_id(message_id: object) -> None:
    if not isinstance(message_id, str) or not message_id:
        raise ValueError(f"message_id must be a non-empty string, got {message_id!r}")


def _checked_precision(precision: str) -> Precision:
    if precision == "level":
        return "level"
    if precision == "exact":
        return "exact"
    raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


class DelayProducer:
    """Wraps a `confluent_kafka.Producer`; every attribute not defined here passes through.

    `precision` is the default for `produce()`: "level" (the level topics) or "exact"
    (the precise topic); each call may override it.
    """

    def __init__(
        self,
        config: dict[str, Any],
        *,
        settings: Settings | None = None,
        levels: LevelSet | None = None,
        precision: Precision = "level",
    ) -> None:
        self.precision = _checked_precision(precision)
        if levels is None:
            settings = settings or load_settings()
            levels = settings.level_set()
        elif settings is None and self.precision == "exact":
            settings = load_settings()  # a configuration error shows now, not at a send
        self.levels = levels
        self._settings = settings
        self._producer = Producer(config)
        self._partitions = TopicPartitions(self._producer)

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
        precision: Precision | None = None,
    ) -> str:
        """Send now, or after `delay`; returns the message id (`delay-id`).

        `precision` overrides the producer's default for this message. An exact delay
        above `max_delay` raises `DelayTooLongError` before anything is sent.
        """
        on_delivery = on_delivery or callback
        kwargs: dict[str, Any] = {"timestamp": timestamp}
        if on_delivery is not None:
            kwargs["on_delivery"] = on_delivery
        user_headers: Headers | None = (
            list(headers.items()) if isinstance(headers, dict) else headers
        )
        mode = self.precision if precision is None else _checked_precision(precision)
        delay_ms: int | None = None
        if mode == "exact":
            timing = exact_timing(delay, deliver_at, self._exact_settings().max_delay_ms)
            if timing is not None:
                precise_topic, far = self._precise_route(*timing)
                count = self._partitions.count(precise_topic, refresh=True)
                message_id, kwargs["partition"] = precise_id(count, far=far)
                envelope = Envelope(
                    topic,
                    timing[0],
                    message_id,
                    partition if partition >= 0 else None,
                    timing[1],
                )
                wrapped = wrap(envelope, user_headers)  # refuses `delay-*` user headers
                self._producer.produce(precise_topic, value, key, headers=wrapped, **kwargs)
                return message_id
        else:
            delay_ms = delay_to_ms(delay, deliver_at)
        message_id = new_id()
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

    def cancel(self, message_id: str, *, on_delivery: DeliveryCallback | None = None) -> None:
        """Ask the precise-mode daemon not to forward the message with `message_id`.

        Sends a cancel marker (no key, no value; headers `delay-v` and `delay-cancel`) to
        the precise-topic partition that holds the message, so the instances holding it
        read the cancel too: the one its id names (see `precise_partition`), however
        many partitions the topic has now. It works whatever this producer's default
        precision is.
        Only messages sent with `precision="exact"` can be cancelled: a level-mode
        message waits in a level topic, and the daemon forwards it regardless. A cancel
        that arrives after the message is due is too late. Like `produce()` this only
        queues the marker: `on_delivery` reports where it landed, `flush()` waits.
        """
        _check_id(message_id)
        headers: Headers = [(H_VERSION, str(VERSION).encode()), (H_CANCEL, message_id.encode())]
        self._send_marker(message_id, headers, on_delivery)

    def reschedule(
        self,
        message_id: str,
        *,
        delay: float | timedelta | None = None,
        deliver_at: datetime | float | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        """Move a pending exact message to a new due time, earlier or later.

        Sends a reschedule marker (no key, no value; headers `delay-v`,
        `delay-reschedule`, and `delay-ms` or `delay-due-ms`) to the partition that
        holds the message, as `cancel` does. `delay` counts from when the broker
        appends the marker; `deliver_at` is an absolute time. The message keeps its id,
        key, value and headers and is delivered once, at the new time; never earlier
        than the daemon reads the marker, so a time in the past means now. A reschedule
        that arrives after the message was sent is too late, and a cancel always wins
        over a reschedule, whichever came first. The daemon counts each outcome
        (`delayservice_precise_reschedules`). A time beyond `max_delay` raises
        `DelayTooLongError` before anything is sent.
        """
        _check_id(message_id)
        if delay is None and deliver_at is None:
            raise ValueError("pass delay= or deliver_at=")
        timing = exact_timing(delay, deliver_at, self._exact_settings().max_delay_ms)
        delay_ms, due_ms = timing if timing is not None else (0, None)
        headers: Headers = [
            (H_VERSION, str(VERSION).encode()),
            (H_RESCHEDULE, message_id.encode()),
            (H_DELAY_MS, str(delay_ms).encode()),
        ]
        if due_ms is not None:
            headers.append((H_DUE_MS, str(due_ms).encode()))
        self._send_marker(message_id, headers, on_delivery)

    def _send_marker(
        self, message_id: str, headers: Headers, on_delivery: DeliveryCallback | None
    ) -> None:
        """Send a cancel or reschedule marker to where the message is: the topic and
        partition its id names, else (a hand-made or older id) crc32 of the id over
        the precise topic's partitions."""
        kwargs: dict[str, Any] = {}
        if on_delivery is not None:
            kwargs["on_delivery"] = on_delivery
        settings = self._exact_settings()
        place = named_place(message_id)
        if place is not None:
            topic = settings.precise_far_topic if place.far else settings.precise_topic
            partition = place.partition
        else:
            topic = settings.precise_topic
            partition = precise_partition(message_id, self._partitions.count(topic))
        self._producer.produce(topic, None, None, partition=partition, headers=headers, **kwargs)

    def _precise_route(self, delay_ms: int, due_ms: int | None) -> tuple[str, bool]:
        """The precise topic for a message due within `precise_far_after`, else the
        far topic; and whether it is the far one."""
        settings = self._exact_settings()
        ahead_ms = max(delay_ms, (due_ms or 0) - time.time() * 1000)
        if ahead_ms > settings.precise_far_after_ms:
            return settings.precise_far_topic, True
        return settings.precise_topic, False

    def _exact_settings(self) -> Settings:
        """Loaded on first need when only `levels=` was given, so a level producer that
        never sends exact messages or cancels never reads settings."""
        if self._settings is None:
            self._settings = load_settings()
        return self._settings

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
