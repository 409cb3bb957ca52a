"""What an application may pass as `delay=` and `deliver_at=`, turned into milliseconds.

A delay is seconds (int or float), a `timedelta`, or a duration string in the
settings' own syntax (`"500ms"`, `"30s"`, `"10m"`, `"2h"`, `"1d"`). Zero means now. A
negative, NaN or infinite delay is a mistake the caller must hear about: sending it at
once would hide a sign error or a division by zero until a message arrives early.
`deliver_at` is epoch seconds or a timezone-aware datetime; a time already past means
now, since a caller computing "now" is always a little late.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta

from delayservice.errors import DelayTooLongError
from delayservice.levels import format_duration_ms, parse_duration_ms

Delay = float | timedelta | str
"""Seconds, a timedelta, or a duration such as "30s"."""
DeliverAt = datetime | float
"""Epoch seconds, or a timezone-aware datetime."""


def delay_seconds(delay: Delay) -> float:
    """`delay` in seconds; ValueError for anything negative, NaN or infinite, TypeError
    for what is not a delay at all."""
    if isinstance(delay, bool):
        raise TypeError(f"delay must be seconds, a timedelta or a duration, got {delay!r}")
    if isinstance(delay, str):
        text = delay
        try:
            delay = float(text)  # a bare number is seconds, as a number delay= is
        except ValueError:
            try:
                return parse_duration_ms(text) / 1000
            except ValueError:
                raise ValueError(
                    f"{text!r} is not a duration: give seconds (30, 1.5) or a duration "
                    "like 500ms, 5s, 1m, 2h or 1d"
                ) from None
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, int | float):  # a bare-number string arrives here too
        try:
            seconds = float(delay)
        except OverflowError:
            seconds = math.inf
    else:
        raise TypeError(f"delay must be seconds, a timedelta or a duration, got {delay!r}")
    if not math.isfinite(seconds):
        raise ValueError(f"delay must be finite, got {seconds}")
    if seconds < 0:
        raise ValueError(f"delay must not be negative, got {seconds:g} s; 0 sends at once")
    return seconds


def epoch_seconds(deliver_at: DeliverAt) -> float:
    if isinstance(deliver_at, datetime):
        if deliver_at.tzinfo is None:
            raise ValueError("deliver_at must be timezone-aware (e.g. datetime.now(UTC))")
        return deliver_at.timestamp()
    if isinstance(deliver_at, bool) or not isinstance(deliver_at, int | float):
        raise TypeError(f"deliver_at must be epoch seconds or a datetime, got {deliver_at!r}")
    try:
        seconds = float(deliver_at)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds):
        raise ValueError(f"deliver_at must be finite, got {seconds}")
    return seconds


def delay_to_ms(delay: Delay | None, deliver_at: DeliverAt | None) -> int | None:
    """Milliseconds to wait, or None for no delay. Sub-millisecond delays round up."""
    if delay is not None and deliver_at is not None:
        raise ValueError("pass delay= or deliver_at=, not both")
    if delay is not None:
        seconds = delay_seconds(delay)
    elif deliver_at is not None:
        seconds = epoch_seconds(deliver_at) - time.time()
    else:
        return None
    return math.ceil(seconds * 1000) if seconds > 0 else None


def exact_timing(
    delay: Delay | None,
    deliver_at: DeliverAt | None,
    max_delay_ms: int,
    limit_name: str = "max_delay",
) -> tuple[int, int | None] | None:
    """`(delay-ms, delay-due-ms)` of an exact message, or None to send it undelayed.

    A relative delay travels as `delay-ms`, counted by the daemon from the broker's
    append time. An absolute time travels as `delay-due-ms` with `delay-ms` 0: the
    daemon's due time is max(append time + delay-ms, delay-due-ms), so time spent
    sending cannot shift it later. Both round up, so rounding never makes it early.
    """
    if delay is not None and deliver_at is not None:
        raise ValueError("pass delay= or deliver_at=, not both")
    limit = f"{limit_name} ({format_duration_ms(max_delay_ms)})"
    remedy = "raise max_delay" if limit_name == "max_delay" else "add a longer level"
    if deliver_at is None:
        delay_ms = delay_to_ms(delay, None)
        if delay_ms is None:
            return None
        if delay_ms > max_delay_ms:
            raise DelayTooLongError(
                f"delay of {delay_ms} ms is above {limit}; {remedy} or shorten the delay"
            )
        return delay_ms, None
    due_ms = math.ceil(epoch_seconds(deliver_at) * 1000)
    ahead_ms = due_ms - time.time() * 1000
    if ahead_ms <= 0:
        return None
    if ahead_ms > max_delay_ms:
        raise DelayTooLongError(
            f"deliver_at is {math.ceil(ahead_ms)} ms ahead, above {limit}; "
            f"{remedy} or deliver sooner"
        )
    return 0, due_ms
