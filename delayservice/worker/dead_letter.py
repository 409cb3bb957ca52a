"""The dead-letter record: the original record plus why and where it came from.

Headers added (all UTF-8 text): `dlq-reason` (a short machine-readable kind),
`dlq-detail` (a human-readable explanation), `dlq-origin-topic`,
`dlq-origin-partition`, `dlq-origin-offset` and `dlq-time-ms`. The original key, value
and headers, envelope included, are kept so the record can be replayed.
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
REASONS: Final = (
    REASON_ENVELOPE,
    REASON_UNKNOWN_TOPIC,
    REASON_UNKNOWN_PARTITION,
    REASON_TOO_LARGE,
    REASON_NOT_AUTHORIZED,
    REASON_REJECTED,
)


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
        (H_REASON, reason.encode()),
        (H_DETAIL, detail.encode()),
        (H_ORIGIN_TOPIC, origin_topic.encode()),
        (H_ORIGIN_PARTITION, str(partition).encode()),
        (H_ORIGIN_OFFSET, str(offset).encode()),
        (H_TIME_MS, str(int(time.time() * 1000)).encode()),
    ]
