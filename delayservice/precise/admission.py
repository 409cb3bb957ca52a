"""From a record read off the precise topic to a held one: envelope, target check, due time.

This is where the never-early promise is decided. A record is due at its append time
plus the delay its envelope asks for, or at its `delay-due-ms` when that is later. The
append time is trusted only when the broker wrote it (LogAppendTime); any other
timestamp is replaced by the time of reading, which can only be later than the append.

Nothing a record carries makes `hold` raise: a record it cannot make sense of comes
back with a `problem` (reason, detail), bound for the dead-letter topic.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message

from delayservice.envelope import Envelope, Headers, unwrap
from delayservice.errors import EnvelopeError
from delayservice.kafka.record_headers import UNREADABLE, read_headers, readable_headers
from delayservice.levels import Level, format_duration_ms
from delayservice.log_throttle import Throttle
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.precise.slot_record import SlotRecord
from delayservice.worker import dead_letter as dl
from delayservice.worker.target_names import TargetNames

log = logging.getLogger(__name__)

NOT_APPEND_TIME: Final = "not_append_time"
_WARN_EVERY_S: Final = 60.0


class Admission:
    def __init__(
        self,
        level: Level,
        max_delay_ms: int,
        reserved_targets: frozenset[str],
        metrics: ServiceMetrics,
    ) -> None:
        """`max_delay_ms`: a longer request is out of this deployment's range."""
        self.level = level
        self._max_delay = max_delay_ms
        self._m_not_append = metrics.level_mismatches.labels(level.name, NOT_APPEND_TIME)
        self._throttle = Throttle(_WARN_EVERY_S)
        self.names = TargetNames(reserved_targets)

    def hold(self, message: Message, slot: Any, now_ms: int | None = None) -> SlotRecord:
        """The record to hold (settled through `slot`); `problem` is set when it cannot
        be forwarded. `now_ms` is when it was read (once per batch on the hot path); any
        time after the record's append keeps due times from ever being early."""
        now_ms = now_ms or int(time.time() * 1000)
        try:
            return self._hold(message, slot, now_ms)
        except Exception as exc:  # a bug or a surprise in one record stays with that record
            log.exception("%s: could not read a record", self.level.topic)
            return self._unreadable(message, slot, now_ms, f"{type(exc).__name__}: {exc}")

    def _hold(self, message: Message, slot: Any, now_ms: int) -> SlotRecord:
        partition, offset = message.partition() or 0, message.offset() or 0
        key, value = message.key(), message.value()
        key_b = key.encode() if isinstance(key, str) else key
        value_b = value.encode() if isinstance(value, str) else value
        raw = read_headers(message)
        if raw is UNREADABLE:  # target and due time unknown: dead-lettered at once
            return SlotRecord(
                partition, offset, key_b, value_b, [], None, now_ms, slot,
                (dl.REASON_UNREADABLE_HEADERS, dl.UNREADABLE_HEADERS_DETAIL),
            )  # fmt: skip
        headers: Headers = (
            raw
            if type(raw) is list
            else list(raw.items())
            if isinstance(raw, dict)
            else list(raw or [])
        )
        try:
            envelope, user_headers, _ = unwrap(headers)
        except EnvelopeError as exc:
            return SlotRecord(
                partition, offset, key_b, value_b, headers, None, now_ms, slot,
                (dl.REASON_ENVELOPE, str(exc)),
            )  # fmt: skip
        due_ms, problem = self._due_ms(message, envelope, now_ms)
        if problem is None:
            problem = self.names.problem(envelope.target)
        return SlotRecord(
            partition, offset, key_b, value_b, user_headers, envelope, due_ms, slot, problem
        )

    def _due_ms(
        self, message: Message, envelope: Envelope, now_ms: int
    ) -> tuple[int, tuple[str, str] | None]:
        ts_type, ts = message.timestamp()
        if ts_type == TIMESTAMP_LOG_APPEND_TIME:
            base = ts
        else:
            base = now_ms  # reading happens after appending: never earlier than the truth
            self._m_not_append.inc()
            if self._throttle.allow(NOT_APPEND_TIME) is not None:
                log.warning(
                    "%s: timestamps are not LogAppendTime; using read time "
                    "(metric delayservice_level_mismatches_total)",
                    self.level.topic,
                )
        if envelope.delay_ms > self._max_delay:
            return base, (
                dl.REASON_DELAY_OUT_OF_RANGE,
                f"delay-ms {envelope.delay_ms} is above the longest delay held here "
                f"({format_duration_ms(self._max_delay)})",
            )
        due = base + envelope.delay_ms
        if envelope.due_ms is not None and envelope.due_ms > due:
            if envelope.due_ms > base + self._max_delay:
                return base, (
                    dl.REASON_DELAY_OUT_OF_RANGE,
                    f"delay-due-ms {envelope.due_ms} is more than "
                    f"{format_duration_ms(self._max_delay)} ahead of its append time",
                )
            due = envelope.due_ms  # an absolute due time is a floor too
        return due, None

    def _unreadable(self, message: Message, slot: Any, now_ms: int, why: str) -> SlotRecord:
        partition, offset = message.partition() or 0, message.offset() or 0
        try:
            key, value = message.key(), message.value()
            headers: Headers = list(readable_headers(message))
        except Exception:  # keep what can be kept: the origin and the reason
            key, value, headers = None, None, []
        key_b = key if isinstance(key, bytes) else None
        value_b = value if isinstance(value, bytes) else None
        return SlotRecord(
            partition, offset, key_b, value_b, headers, None, now_ms, slot,
            (dl.REASON_INTERNAL, why),
        )  # fmt: skip
