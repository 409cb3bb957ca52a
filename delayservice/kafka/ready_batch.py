"""Reading what has arrived without waiting for a full batch.

`Consumer.consume(n, timeout)` returns only when it has `n` records or the timeout has
passed: with fewer queued it waits out the whole timeout (measured: one queued record,
`consume(2000, 0.5)` returned after 500 ms, five times of five). A reader that must act
on a record as soon as it arrives takes what is queued at once, and blocks only for
the first record when nothing is.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import Message


def ready_batch(consumer: Any, most: int, timeout: float) -> list[Message]:
    """Up to `most` records already queued; when none are, the first to arrive within
    `timeout` seconds (an empty list if none does)."""
    messages: list[Message] = consumer.consume(most, 0)
    if messages:
        return messages
    first: list[Message] = consumer.consume(1, timeout)
    return first
