"""The cancel and reschedule markers written for one exact message, and what the daemon
replied to each: what `find` needs to say whether a cancel took and when a moved
message is due now.

A marker is an ordinary record on the message's partition, so reading it says only
that it was asked for. What it did is in the replies on the outcomes topic
(`markers.replies`), keyed by where the marker landed. Nothing else tells a
refused or too-late reschedule from one that moved the message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from delayservice.markers.replies import (
    REPLY_SKEW_MS,
    RESCHEDULE,
    MarkerReply,
    parse_reply,
    reply_key,
)
from delayservice.markers.requests import BadMarkerError, reschedule_request
from delayservice.precise.placement import Role
from delayservice.status.topic_scan import Hit, TopicScan

MOVED: Final = "moved"


@dataclass
class Marker:
    kind: str  # `replies.CANCEL` or `replies.RESCHEDULE`
    hit: Hit
    replies: list[MarkerReply] = field(default_factory=list)

    @property
    def reply(self) -> MarkerReply | None:
        """The owner's reply, else the first: the owner's wheel is the one that sends,
        and a replica's answer differs from it only around a takeover."""
        for reply in self.replies:
            if reply.role == Role.OWNER.value:
                return reply
        return self.replies[0] if self.replies else None

    @property
    def outcome(self) -> str | None:
        reply = self.reply
        return None if reply is None else reply.outcome

    @property
    def asked_due_ms(self) -> int | None:
        """The due time a reschedule marker asks for, as the intake reads it (None: a
        cancel, or a marker the daemon refuses as unreadable)."""
        try:
            request = reschedule_request(list(self.hit.headers.items()))
        except BadMarkerError:
            return None
        if request is None:
            return None
        _, delay_ms, due_ms = request
        return max(self.hit.timestamp_ms + (delay_ms or 0), due_ms or 0)

    def as_json(self) -> dict[str, Any]:
        reply = self.reply
        out: dict[str, Any] = {
            "topic": self.hit.topic,
            "partition": self.hit.partition,
            "offset": self.hit.offset,
            "timestamp_ms": self.hit.timestamp_ms,
            "outcome": self.outcome,
            "replies": [
                {"outcome": r.outcome, "due_ms": r.due_ms, "member": r.member, "role": r.role}
                for r in self.replies
            ],
        }
        if self.kind == RESCHEDULE:
            out["asked_due_ms"] = self.asked_due_ms
            out["due_ms"] = reply.due_ms if reply is not None else None
        return out


def read_replies(
    scan: TopicScan,
    outcomes_topic: str,
    markers: list[Marker],
    on_read: Callable[[int], None] | None = None,
) -> bool:
    """Attach to each marker the replies to it; False when `outcomes_topic` does not
    exist (the outcomes are unknown, which is no reason to fail a lookup)."""
    partitions = scan.partitions(outcomes_topic)
    if partitions is None:
        return False
    if not markers:
        return True
    by_key = {reply_key(m.hit.topic, m.hit.partition, m.hit.offset): m for m in markers}
    since_ms = min(m.hit.timestamp_ms for m in markers) - REPLY_SKEW_MS
    plan = scan.planned(outcomes_topic, partitions, since_ms)
    for key, value in scan.scan_keys(outcomes_topic, plan, by_key, on_read):
        reply = parse_reply(value)
        marker = by_key[key]
        if reply is not None and reply.kind == marker.kind:  # anyone may write the topic
            marker.replies.append(reply)
    return True


def moved_due_ms(reschedules: list[Marker]) -> int | None:
    """The due time the last move set, None when none moved the message. The daemon
    applies a partition's markers in offset order, so the last by offset wins."""
    due: int | None = None
    for marker in sorted(reschedules, key=lambda m: m.hit.offset):
        reply = marker.reply
        if reply is not None and reply.outcome == MOVED and reply.due_ms is not None:
            due = reply.due_ms
    return due


def calls_off(cancels: list[Marker]) -> bool:
    """Whether some cancel holds: one the daemon accepted, or one whose reply is not
    known (it may yet be). A refused or too-late cancel leaves the message as it was."""
    return any(m.reply is None or m.reply.applied for m in cancels)
