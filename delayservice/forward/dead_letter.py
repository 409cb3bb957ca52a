"""The dead-letter record: the original record plus why and where it came from.

Headers added (all UTF-8 text): `dlq-reason` (a short machine-readable kind),
`dlq-detail` (a human-readable explanation), `dlq-origin-topic`,
`dlq-origin-partition`, `dlq-origin-offset` and `dlq-time-ms`. The original key, value
and headers, envelope included, are kept so the record can be replayed.

A dead letter must always fit, or the bad record it carries would be retried forever:
the detail is capped at `MAX_DETAIL` characters, and a record too large for the
dead-letter topic is replaced by a stub (`dlq-stub: 1`) that keeps the reason, the
origin and the original sizes, and the `delay-id` when there is one, but no value.
"""

from __future__ import annotations

import time
from typing import Final

from delayservice.envelope import Headers

H_REASON: Final = "dlq-reason"
H_DETAIL: Final = "dlq-detail"
H_ORIGIN_TOPIC: Final = "dlq-origin-topic"
H_ORIGIN_PARTITION: Final = "dlq-origin-partition"
H_ORIGIN_OFFSET: Final = "dlq-origin-offset"
H_TIME_MS: Final = "dlq-time-ms"

REASON_ENVELOPE: Final = "invalid_envelope"
REASON_UNKNOWN_TOPIC: Final = "unknown_topic"
REASON_UNKNOWN_PARTITION: Final = "unknown_partition"
REASON_TOO_LARGE: Final = "too_large"
REASON_NOT_AUTHORIZED: Final = "not_authorized"
REASON_REJECTED: Final = "rejected"
REASON_INVALID_TARGET: Final = "invalid_target"
REASON_DELAY_OUT_OF_RANGE: Final = "delay_out_of_range"
REASON_RETRIES_EXHAUSTED: Final = "retries_exhausted"
REASON_INTERNAL: Final = "internal_error"
REASON_UNREADABLE_HEADERS: Final = "unreadable_headers"
"""The client cannot decode the record's headers (a name that is not UTF-8): its due time
and target are unknown, so it is dead-lettered at once, with its key and value only."""
UNREADABLE_HEADERS_DETAIL: Final = (
    "the record's headers cannot be decoded (a header name that is not UTF-8); "
    "its target and due time are unknown"
)
REASONS: Final = (
    REASON_ENVELOPE,
    REASON_UNKNOWN_TOPIC,
    REASON_UNKNOWN_PARTITION,
    REASON_TOO_LARGE,
    REASON_NOT_AUTHORIZED,
    REASON_REJECTED,
    REASON_INVALID_TARGET,
    REASON_DELAY_OUT_OF_RANGE,
    REASON_RETRIES_EXHAUSTED,
    REASON_INTERNAL,
    REASON_UNREADABLE_HEADERS,
)

H_STUB: Final = "dlq-stub"
H_KEY_BYTES: Final = "dlq-original-key-bytes"
H_VALUE_BYTES: Final = "dlq-original-value-bytes"
H_HEADER_BYTES: Final = "dlq-original-header-bytes"
MAX_DETAIL: Final = 1000
_STUB_ID_MAX: Final = 200


def capped(detail: str) -> str:
    if len(detail) <= MAX_DETAIL:
        return detail
    return detail[: MAX_DETAIL - 20] + f"... ({len(detail)} chars)"


def dead_letter_headers(
    original: Headers,
    reason: str,
    detail: str,
    origin_topic: str,
    partition: int,
    offset: int,
) -> Headers:
    return [
        *original,
        *_dlq_headers(reason, detail, origin_topic, partition, offset),
    ]


def _dlq_headers(
    reason: str, detail: str, origin_topic: str, partition: int, offset: int
) -> Headers:
    return [
        (H_REASON, reason.encode()),
        (H_DETAIL, capped(detail).encode(errors="replace")),
        (H_ORIGIN_TOPIC, origin_topic.encode()),
        (H_ORIGIN_PARTITION, str(partition).encode()),
        (H_ORIGIN_OFFSET, str(offset).encode()),
        (H_TIME_MS, str(int(time.time() * 1000)).encode()),
    ]


def stub_headers(
    key: bytes | None,
    value: bytes | None,
    original: Headers,
    reason: str,
    detail: str,
    origin: tuple[str, int, int],
) -> Headers:
    """Headers of a dead letter that carries no payload, for records too large to copy."""
    header_bytes = 0
    message_id: bytes | None = None
    for name, header_value in original:
        header_bytes += len(name) + (len(header_value) if header_value else 0)
        if name == "delay-id" and isinstance(header_value, bytes):
            message_id = header_value
    out: Headers = []
    if message_id is not None and len(message_id) <= _STUB_ID_MAX:
        out.append(("delay-id", message_id))
    return [
        *out,
        *_dlq_headers(reason, detail, *origin),
        (H_STUB, b"1"),
        (H_KEY_BYTES, str(len(key) if key else 0).encode()),
        (H_VALUE_BYTES, str(len(value) if value else 0).encode()),
        (H_HEADER_BYTES, str(header_bytes).encode()),
    ]
