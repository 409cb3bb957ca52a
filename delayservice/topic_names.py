"""Kafka's own rule for topic names, checked before a name reaches librdkafka or the broker.

A name the broker would refuse (bad characters, too long, `.`/`..`, an internal topic)
is refused by every retry too, and some names make librdkafka raise plain Python errors
(an embedded NUL, a name past 512 bytes). Checking locally turns all of them into one
permanent, per-record answer. The rule mirrors `org.apache.kafka.common.internals.Topic`.
"""

from __future__ import annotations

import re
from typing import Final

MAX_LENGTH: Final = 249
_LEGAL: Final = re.compile(r"[a-zA-Z0-9._-]+")
INTERNAL_TOPICS: Final = frozenset(
    {"__consumer_offsets", "__transaction_state", "__share_group_state", "__cluster_metadata"}
)


def invalid_reason(name: str, reserved: frozenset[str] = frozenset()) -> str | None:
    """Why `name` cannot be a forwarding target, or None when it can.

    `reserved` holds names that exist but must not receive forwarded records (the
    service's own level and dead-letter topics: forwarding there would loop).
    """
    if not name:
        return "the topic name is empty"
    if len(name) > MAX_LENGTH:
        return f"the topic name is {len(name)} characters long; Kafka allows {MAX_LENGTH}"
    if name in (".", ".."):
        return f"{name!r} is not a legal topic name"
    if _LEGAL.fullmatch(name) is None:
        return "the topic name has characters other than ASCII letters, digits, '.', '_' and '-'"
    if name in INTERNAL_TOPICS:
        return f"{name} is an internal Kafka topic"
    if name in reserved:
        return f"{name} is one of this service's own topics"
    return None
