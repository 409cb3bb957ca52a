"""From a consumed record to a held one: envelope, target check and due time.

This is where the never-early promise is decided. A record is due at its append time
plus the larger of its level's delay and the delay its envelope asks for, so a
producer whose levels differ from the daemon's (a forgotten setting, a rolling change)
makes a message late, never early. The append time is trusted only when the broker
wrote it (LogAppendTime); any other timestamp is replaced by the time of reading,
which can only be later than the append. Mismatches are counted and logged.

Nothing a record carries makes `hold` raise: a record it cannot make sense of comes
back bound for the dead-letter topic with a reason.
"""

from __future__ import annotations

import logging
import time
from typing import Final

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message

from delayservice.envelope import Envelope, Headers, unwrap
from delayservice.errors import EnvelopeError
from delayservice.levels import Level, format_duration_ms
from delayservice.log_throttle import Throttle
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.worker import dead_letter as dl
from delayservice.worker.ledger import PartitionLedger
from delayservice.worker.record import HeldRecord, record_size
from delayservice.worker.target_names import TargetNames

log = logging.getLogger(__name__)

ABOVE_LEVEL: Final = "delay_above_level"
BELOW_LEVEL: Final = "delay_below_level"
NOT_APPEND_TIME: Final = "not_append_time"
MISMATCH_KINDS: Final = (ABOVE_LEVEL, BELOW_LEVEL, NOT_APPEND_TIME)
_WARN_EVERY_S: Final = 60.0
_INF: Final = float("inf")


class Admission:
    def __init__(
        self,
        level: Level,
        previous_delay_ms: int,
        max_delay_ms: int,
        reserved_targets: frozenset[str],
        metrics: ServiceMetrics,
        *,
        exact: bool = False,
    ) -> None:
        """`previous_delay_ms` is the next smaller level's delay (0 for the first);
        `max_delay_ms` the top level's: a longer request is out of this deployment's range.
        `exact`: precise mode, where every delay is its own and none is a mismatch."""
        self.level = level
        self._previous = previous_delay_ms
        self._max_delay = max_delay_ms
        self._reserved = reserved_targets
        self._exact = exact
        self._mismatches = {
            k: metrics.level_mismatches.labels(level.name, k) for k in MISMATCH_KINDS
        }
        self._throttle = Throttle(_WARN_EVERY_S)
        self._m_clock = metrics.clock_offset
        self._read_delay_min = _INF
        self.names = TargetNames(reserved_targets)

    def hold(
        self, message: Message, ledger: PartitionLedger, now_ms: int | None = None
    ) -> HeldRecord:
        """The record to track; `dead_letter` is set when it cannot be forwarded.

        `now_ms` is when the record was read (once per batch on the hot path); any time
        after the record's append keeps due times from ever being early.
        """
        try:
            return self._hold(message, ledger, now_ms or int(time.time() * 1000))
        except Exception as exc:  # a bug or a surprise in one record stays with that record
            log.exception("%s: could not read a record", self.level.topic)
            return self._unreadable(message, ledger, f"{type(exc).__name__}: {exc}")

    def _hold(self, message: Message, ledger: PartitionLedger, now_ms: int) -> HeldRecord:
        partition, offset = message.partition() or 0, message.offset() or 0
        key, value = message.key(), message.value()
        key_b = key.encode() if isinstance(key, str) else key
        value_b = value.encode() if isinstance(value, str) else value
        raw = message.headers()  # a fresh list per call: no copy needed
        headers: Headers = (
            raw
            if type(raw) is list
            else list(raw.items())
            if isinstance(raw, dict)
            else list(raw or [])
        )
        try:
            envelope, user_headers, header_bytes = unwrap(headers)
        except EnvelopeError as exc:
            size = record_size(key_b, value_b, headers)
            return HeldRecord(
                ledger, partition, offset, key_b, value_b, headers, size, None, now_ms,
                dead_letter=(dl.REASON_ENVELOPE, str(exc)),
            )  # fmt: skip
        size = header_bytes + (len(key_b) if key_b else 0) + (len(value_b) if value_b else 0)
        due_ms, problem = self._due_ms(message, envelope, now_ms)
        if problem is None:
            problem = self.names.problem(envelope.target)
        return HeldRecord(
            ledger, partition, offset, key_b, value_b, user_headers, size, envelope, due_ms,
            dead_letter=problem,
        )  # fmt: skip

    def _due_ms(
        self, message: Message, envelope: Envelope, now_ms: int
    ) -> tuple[int, tuple[str, str] | None]:
        ts_type, ts = message.timestamp()
        if ts_type == TIMESTAMP_LOG_APPEND_TIME:
            base = ts
            self._read_delay_min = min(self._read_delay_min, now_ms - ts)
        else:
            base = now_ms  # reading happens after appending: never earlier than the truth
            self._mismatch(NOT_APPEND_TIME, "timestamps are not LogAppendTime; using read time")
        delay = self.level.delay_ms
        if envelope.delay_ms > delay:
            if envelope.delay_ms > self._max_delay:
                return base, (
                    dl.REASON_DELAY_OUT_OF_RANGE,
                    f"delay-ms {envelope.delay_ms} is above the longest delay held here "
                    f"({format_duration_ms(self._max_delay)})",
                )
            if not self._exact:
                self._mismatch(ABOVE_LEVEL, "envelopes ask for more than the level; held longer")
            delay = envelope.delay_ms
        elif envelope.delay_ms <= self._previous and not self._exact:
            self._mismatch(BELOW_LEVEL, "envelopes belong to a shorter level; delivered late")
        due = base + delay
        if envelope.due_ms is not None and envelope.due_ms > due:
            if envelope.due_ms > base + self._max_delay:
                return base, (
                    dl.REASON_DELAY_OUT_OF_RANGE,
                    f"delay-due-ms {envelope.due_ms} is more than "
                    f"{format_duration_ms(self._max_delay)} ahead of its append time",
                )
            due = envelope.due_ms  # an absolute due time is a floor too
        return due, None

    def _mismatch(self, kind: str, what: str) -> None:
        self._mismatches[kind].inc()
        if self._throttle.allow(kind) is not None:
            log.warning(
                "%s (level %s): %s; check that producers and daemons use the same levels "
                "(metric delayservice_level_mismatches_total)",
                self.level.topic,
                self.level.name,
                what,
            )

    def _unreadable(self, message: Message, ledger: PartitionLedger, why: str) -> HeldRecord:
        partition, offset = message.partition() or 0, message.offset() or 0
        try:
            key, value, raw = message.key(), message.value(), message.headers()
            headers: Headers = list(raw) if isinstance(raw, list) else []
        except Exception:  # keep what can be kept: the origin and the reason
            key, value, headers = None, None, []
        key_b = key if isinstance(key, bytes) else None
        value_b = value if isinstance(value, bytes) else None
        return HeldRecord(
            ledger, partition, offset, key_b, value_b, headers,
            record_size(key_b, value_b, headers), None, int(time.time() * 1000),
            dead_letter=(dl.REASON_INTERNAL, why),
        )  # fmt: skip

    def publish(self) -> None:
        """Export the clock estimate: the smallest (local time - append time) seen since
        the last call. Read latency only adds to it, so it bounds from above how far this
        host's clock runs ahead of the broker's, the direction that could make a message
        early."""
        if self._read_delay_min != _INF:
            self._m_clock.labels(self.level.name).set(self._read_delay_min / 1000)
            self._read_delay_min = _INF
