"""What `find` concludes from an exact message's markers and the replies to them, on a
scan that stands in for the broker."""

from __future__ import annotations

from typing import Any

from delayservice.markers.replies import CANCEL, REPLY_SKEW_MS, RESCHEDULE, MarkerReply, reply_key
from delayservice.status.marker_trail import (
    Marker,
    calls_off,
    moved_due_ms,
    read_replies,
)
from delayservice.status.topic_scan import Hit

T0 = 1_800_000_000_000
MID = "0123456789abcdef0123456789abcdef-p1"


def _marker(kind: str, offset: int, *replies: MarkerReply, **headers: bytes) -> Marker:
    hit = Hit("dp", 1, offset, T0 + offset, dict(headers))
    return Marker(kind, hit, list(replies))


def _moved(due_ms: int, role: str = "owner") -> MarkerReply:
    return MarkerReply(RESCHEDULE, MID, "moved", due_ms, 0, role)


def _said(outcome: str, kind: str = RESCHEDULE, role: str = "owner") -> MarkerReply:
    return MarkerReply(kind, MID, outcome, None, 0, role)


def test_the_last_move_by_marker_offset_sets_the_due_time():
    later_marker = _marker(RESCHEDULE, 9, _moved(T0 + 5_000))
    earlier_marker = _marker(RESCHEDULE, 4, _moved(T0 + 90_000))
    refused_after = _marker(RESCHEDULE, 12, _said("refused"))
    unanswered = _marker(RESCHEDULE, 15)
    assert moved_due_ms([later_marker, earlier_marker, refused_after, unanswered]) == T0 + 5_000
    assert moved_due_ms([refused_after, unanswered]) is None


def test_the_owners_reply_is_the_outcome_whatever_came_first():
    marker = _marker(RESCHEDULE, 3, _said("too_late", role="replica"), _moved(T0 + 7_000))
    assert marker.outcome == "moved"
    assert moved_due_ms([marker]) == T0 + 7_000
    only_replica = _marker(RESCHEDULE, 3, _said("unmatched", role="replica"))
    assert only_replica.outcome == "unmatched"
    assert _marker(RESCHEDULE, 3).outcome is None


def test_a_cancel_holds_unless_its_reply_says_it_did_not():
    assert calls_off([_marker(CANCEL, 2, _said("accepted", CANCEL))])
    assert calls_off([_marker(CANCEL, 2)])  # no reply yet: it may still take
    assert not calls_off([_marker(CANCEL, 2, _said("refused", CANCEL))])
    assert not calls_off([_marker(CANCEL, 2, _said("too_late", CANCEL))])
    assert calls_off(
        [
            _marker(CANCEL, 2, _said("refused", CANCEL)),
            _marker(CANCEL, 5, _said("accepted", CANCEL)),
        ]
    )


def test_a_reschedule_asks_for_its_append_time_plus_its_delay_or_its_due_time():
    by_delay = _marker(RESCHEDULE, 0, **{"delay-reschedule": MID.encode(), "delay-ms": b"1500"})
    assert by_delay.asked_due_ms == T0 + 1_500
    by_time = _marker(
        RESCHEDULE,
        0,
        **{"delay-reschedule": MID.encode(), "delay-ms": b"0", "delay-due-ms": b"1900000000000"},
    )
    assert by_time.asked_due_ms == 1_900_000_000_000
    unreadable = _marker(RESCHEDULE, 0, **{"delay-reschedule": MID.encode(), "delay-ms": b"x"})
    assert unreadable.asked_due_ms is None


class _Scan:
    """The outcomes topic as `read_replies` sees it through `TopicScan`."""

    def __init__(self, records: list[tuple[bytes, bytes | None]] | None) -> None:
        self.records = records
        self.since_ms: int | None = None

    def partitions(self, topic: str) -> list[int] | None:
        return None if self.records is None else [0]

    def planned(self, topic: str, partitions: list[int], since_ms: int) -> dict[int, Any]:
        self.since_ms = since_ms
        return {0: (0, 1)}

    def scan_keys(self, topic: str, plan: Any, keys: Any, on_read: Any = None) -> list[Any]:
        assert self.records is not None
        return [(key, value) for key, value in self.records if key in keys]


def test_replies_are_matched_to_their_markers_by_where_the_marker_landed():
    cancel = _marker(CANCEL, 4)
    move = _marker(RESCHEDULE, 6)
    scan = _Scan(
        [
            (reply_key("dp", 1, 6), _moved(T0 + 60_000).encode()),
            (reply_key("dp", 1, 4), _said("accepted", CANCEL).encode()),
            (reply_key("dp", 1, 4), _said("moved").encode()),  # another kind: not its reply
            (reply_key("dp", 1, 6), b"not json"),
            (reply_key("dp", 2, 6), _said("refused").encode()),  # another partition's marker
        ]
    )
    assert read_replies(scan, "dp_outcomes", [cancel, move])
    assert [r.outcome for r in cancel.replies] == ["accepted"]
    assert [r.outcome for r in move.replies] == ["moved"]
    assert scan.since_ms == T0 + 4 - REPLY_SKEW_MS  # from before the first marker


def test_without_the_outcomes_topic_the_outcomes_are_unknown():
    move = _marker(RESCHEDULE, 6)
    assert not read_replies(_Scan(None), "dp_outcomes", [move])
    assert move.outcome is None
