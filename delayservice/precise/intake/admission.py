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

from delayservice.envelope import ByteHeaders, Envelope, Headers, plain_tail, unwrap
from delayservice.errors import EnvelopeError
from delayservice.forward import dead_letter as dl
from delayservice.forward.target_names import TargetNames
from delayservice.kafka.record_headers import UNREADABLE, read_headers, readable_headers
from delayservice.levels import Level, format_duration_ms
from delayservice.log_throttle import Throttle
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.precise.storage.slot_record import SlotRecord

log = logging.getLogger(__name__)

NOT_APPEND_TIME: Final = "not_append_time"
VALID_TARGETS_KEPT: Final = 10_000
Plain = tuple[int, str, int, str, "int | None", ByteHeaders, "str | None"]
"""What `Admission.plain` reads from a common record: (due ms, target, delay ms, id,
`delay-due-ms` or None, the user's headers, `delay-partitioner` or None)."""
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
        self._valid_targets: set[str] = set()
        """Targets `names` found valid, for the common record's one set lookup."""

    def plain(self, message: Message, headers: object) -> Plain | None:
        """The common record, decided without building anything: a broker-written
        timestamp, the envelope as `DelayProducer` writes it (`plain_tail`), a delay in
        range and a valid target. Returns (due ms, target, delay ms, id, due-ms header,
        user headers, partitioner); None for anything else, which `hold` then decides in full (the
        same due time for a record both accept: the append time plus the delay, or the
        `delay-due-ms` when later)."""
        tail = plain_tail(headers)
        if tail is None:
            return None
        kind, base = message.timestamp()
        if kind != TIMESTAMP_LOG_APPEND_TIME:
            return None
        target, delay_ms, message_id, due_header, user, partitioner = tail
        if delay_ms > self._max_delay:
            return None
        if target not in self._valid_targets:
            if self.names.problem(target) is not None:
                return None
            if len(self._valid_targets) >= VALID_TARGETS_KEPT:
                self._valid_targets.clear()
            self._valid_targets.add(target)
        due = base + delay_ms
        if due_header is not None and due_header > due:
            if due_header > base + self._max_delay:
                return None
            due = due_header
        return due, target, delay_ms, message_id, due_header, user, partitioner

    def hold(
        self, message: Message, slot: Any, now_ms: int | None = None, headers: object = None
    ) -> SlotRecord:
        """The record to hold (settled through `slot`); `problem` is set when it cannot
        be forwarded. `now_ms` is when it was read (once per batch on the hot path); any
        time after the record's append keeps due times from ever being early. `headers`:
        what `read_headers` gave for it, when the caller has read them already."""
        now_ms = now_ms or int(time.time() * 1000)
        try:
            return self._hold(message, slot, now_ms, headers)
        except Exception as exc:  # a bug or a surprise in one record stays with that record
            log.exception("%s: could not read a record", self.level.topic)
            return self._unreadable(message, slot, now_ms, f"{type(exc).__name__}: {exc}")

    def _hold(self, message: Message, slot: Any, now_ms: int, raw: Any) -> SlotRecord:
        partition, offset = message.partition() or 0, message.offset() or 0
        key, value = message.key(), message.value()
        key_b = key.encode() if isinstance(key, str) else key
        value_b = value.encode() if isinstance(value, str) else value
        if raw is None:
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
