"""Replies to cancel and reschedule markers: what the daemon did with each one.

A marker is an ordinary record: its sender learns where it landed, not what it did.
So once a marker's outcome is durable on the daemon's disk, each holder of its
partition writes one reply to the outcomes topic (`{precise_topic}_outcomes`, one
partition, deleted by age), keyed by where the marker landed, `topic:partition:offset`,
and the marker's offset is committed only once the reply is acknowledged: a crash in
between reads the marker again and answers it again (a move already done is answered
`moved` again), so no applied move goes unanswered. `delayservice cancel` and
`reschedule` wait for theirs (`markers.outcome`), and the audit judges moved messages
by them. Readers take the first reply per key.

Value: JSON `{"v": 1, "kind": "cancel" | "reschedule", "id", "outcome", "due_ms"
(a move's new due time, else null), "member", "role"}`. Level mode answers on its own
outcomes topic in the same form (`level.markers.answers`), with "member" and "role" null
and two more fields when they say something: "reason" (why a marker was not applied)
and "copy" (`topic:partition` where a moved message's copy was written).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from delayservice.errors import DelayServiceError
from delayservice.kafka.client_seam import ProducerClient

log = logging.getLogger(__name__)

VERSION: Final = 1
CANCEL: Final = "cancel"
RESCHEDULE: Final = "reschedule"

APPLIED: Final = frozenset({"accepted", "moved"})
"""Outcomes that did what the marker asked: a cancel kept (the message, if pending,
will not be delivered), a message moved."""
CANCELLED: Final = "cancelled"
"""Level mode's answer to a cancel it kept (precise mode says `accepted`); to a
reschedule, in both modes, that a cancel came first."""

REPLY_SKEW_MS: Final = 300_000
"""Replies carry the replying host's clock (CreateTime), markers the broker's
(LogAppendTime): replies are read from this long before the first marker, so a host
clock that lags the broker's by up to this much loses none."""


def reply_key(topic: str, partition: int, offset: int) -> bytes:
    """Where the marker landed: the key of its replies."""
    return f"{topic}:{partition}:{offset}".encode()


@dataclass(frozen=True, slots=True)
class MarkerReply:
    kind: str
    message_id: str
    outcome: str
    due_ms: int | None = None
    member: int | None = None
    role: str | None = None
    reason: str | None = None
    copy: str | None = None

    def encode(self) -> bytes:
        fields: dict[str, Any] = {
            "v": VERSION,
            "kind": self.kind,
            "id": self.message_id,
            "outcome": self.outcome,
            "due_ms": self.due_ms,
            "member": self.member,
            "role": self.role,
        }
        if self.reason is not None:
            fields["reason"] = self.reason
        if self.copy is not None:
            fields["copy"] = self.copy
        return json.dumps(fields, separators=(",", ":")).encode()

    @property
    def applied(self) -> bool:
        """Whether the marker did what it asked (a level cancel says `cancelled`)."""
        return self.outcome in APPLIED or (self.kind == CANCEL and self.outcome == CANCELLED)


def parse_reply(raw: bytes | None) -> MarkerReply | None:
    """A reply read back, or None for anything malformed (never raises: the topic is
    writable by anyone who can write the precise topic)."""
    try:
        data: Any = json.loads(raw or b"")
        if not isinstance(data, dict) or data.get("v") != VERSION:
            return None
        kind, message_id, outcome = data["kind"], data["id"], data["outcome"]
        due_ms, member, role = data.get("due_ms"), data.get("member"), data.get("role")
        reason, copy = data.get("reason"), data.get("copy")
        if not all(isinstance(x, str) for x in (kind, message_id, outcome)):
            return None
        if not all(x is None or type(x) is int for x in (due_ms, member)):
            return None
        if not all(x is None or isinstance(x, str) for x in (role, reason, copy)):
            return None
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    return MarkerReply(kind, message_id, outcome, due_ms, member, role, reason, copy)


@dataclass(frozen=True, slots=True)
class Answered:
    """One marker's outcome, as the intake decided it."""

    partition: int
    offset: int
    reply: MarkerReply


class MarkerRepliesError(DelayServiceError):
    """Replies were not acknowledged: the markers are read (and answered) again."""


class MarkerReplies:
    """Writes the replies of one member through the daemon's shared producer, and waits
    until the broker has them; exactly-once, through `in_transaction` (the forwarder's
    transactions, `DeliveryLog.answer`) instead."""

    def __init__(
        self,
        outcomes_topic: str,
        marker_topic: str,
        producer: ProducerClient,
        member: int,
        role_of: Callable[[int], str | None],
        flush_timeout_s: float = 10.0,
        in_transaction: Callable[[list[tuple[bytes, bytes]]], None] | None = None,
    ) -> None:
        self._topic = outcomes_topic
        self._marker_topic = marker_topic
        self._producer = producer
        self._member = member
        self._role_of = role_of
        self._flush_timeout = flush_timeout_s
        self._in_transaction = in_transaction

    def records(self, answered: list[Answered]) -> list[tuple[bytes, bytes]]:
        """The replies as (key, value) records of the outcomes topic."""
        out = []
        for item in answered:
            reply = MarkerReply(
                item.reply.kind,
                item.reply.message_id,
                item.reply.outcome,
                item.reply.due_ms,
                self._member,
                self._role_of(item.partition),
            )
            out.append((reply_key(self._marker_topic, item.partition, item.offset), reply.encode()))
        return out

    def send(self, answered: list[Answered]) -> None:
        """Produce the replies and flush (or have a transaction commit them); raises
        `MarkerRepliesError` unless every one was acknowledged."""
        records = self.records(answered)
        if self._in_transaction is not None:
            self._in_transaction(records)
            return
        failures: list[str] = []

        def delivered(error: Any, _message: Any) -> None:
            if error is not None:
                failures.append(error.str() if hasattr(error, "str") else str(error))

        for key, value in records:
            try:
                self._producer.produce(self._topic, value, key, on_delivery=delivered)
            except BufferError as exc:
                raise MarkerRepliesError(
                    f"replies on {self._topic}: {exc}", retriable=True
                ) from exc
        left = self._producer.flush(self._flush_timeout)
        if left or failures:
            why = failures[0] if failures else f"{left} not acknowledged in {self._flush_timeout} s"
            raise MarkerRepliesError(f"replies on {self._topic} not written: {why}", retriable=True)
