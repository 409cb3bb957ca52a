"""The rules of level cancel and reschedule without a broker: ids, what each marker
does to each copy of a message, what the book refuses, and the gate the forwarders
wait on."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

from delayservice.level.markers.book import REFUSED, UNMATCHED, MarkerBook
from delayservice.level.markers.filing import marker_of
from delayservice.level.markers.gate import BLOCKED, MarkerGate
from delayservice.level.markers.verdict import (
    CANCEL_IT,
    CLOSED,
    FORWARD,
    MOVE,
    LevelMarker,
    verdict,
)
from delayservice.levels import LevelSet
from delayservice.markers.level_ids import is_level_id, level_id, level_place
from delayservice.markers.replies import CANCEL, RESCHEDULE, MarkerReply

LEVELS = LevelSet.parse("5s,10s,1m")


def cancel(at: int, offset: int, mid: str = "m") -> LevelMarker:
    return LevelMarker(CANCEL, mid, at, "markers", 0, offset)


def move(at: int, offset: int, asked: int, mid: str = "m") -> LevelMarker:
    return LevelMarker(RESCHEDULE, mid, at, "markers", 0, offset, asked)


# -- ids ----------------------------------------------------------------------------
def test_a_level_id_names_its_level_partition_and_send_time():
    mid = level_id(3, 17, sent_ms=1_764_000_000_123)
    assert level_place(mid) == (3, 17, 1_764_000_000_123)
    assert is_level_id(mid)
    assert len(mid.split("-")[0]) == 32
    assert level_id(3, 17) != level_id(3, 17)


@pytest.mark.parametrize(
    "mid",
    [
        "3f0c6be1a7d84b6e9d9c2a51e0f7d312",  # the form level ids had before
        "3f0c6be1a7d84b6e9d9c2a51e0f7d312-p1",  # an exact id
        "3f0c6be1a7d84b6e9d9c2a51e0f7d312-l0p1",  # no level 0
        "3f0c6be1a7d84b6e9d9c2a51e0f7d312-l1p01",
        "3F0C6BE1A7D84B6E9D9C2A51E0F7D312-l1p1",
        "3f0c6be1a7d84b6e9d9c2a51e0f7d312-l1p1 ",
        "",
    ],
)
def test_any_other_id_names_no_place(mid):
    assert level_place(mid) is None


# -- the verdict ---------------------------------------------------------------------
def test_markers_before_the_due_time_act_and_those_after_are_too_late():
    assert verdict([cancel(99, 0)], None, 100, set()).action == CANCEL_IT
    late = verdict([cancel(100, 0)], None, 100, set())
    assert late.action == FORWARD
    assert [outcome for _, outcome in late.answers] == ["too_late"]


def test_a_cancel_wins_whatever_the_order_and_answers_every_marker_cancelled():
    for markers in ([cancel(10, 0), move(20, 1, 500)], [move(10, 0, 500), cancel(20, 1)]):
        found = verdict(markers, None, 100, set())
        assert found.action == CANCEL_IT
        assert {outcome for _, outcome in found.answers} == {"cancelled"}


def test_the_last_reschedule_moves_it_and_each_is_answered_moved():
    found = verdict([move(30, 2, 900), move(10, 0, 500), move(120, 3, 50)], None, 100, set())
    assert found.action == MOVE
    assert found.marker is not None
    assert found.marker.asked_due_ms == 900
    assert sorted(m.offset for m, _ in found.answers) == [0, 2]


def test_a_move_carried_out_ends_the_copy_and_later_markers_belong_to_the_next():
    first, later = move(10, 0, 500), cancel(300, 1)
    closed = verdict([first, later], None, 100, {first.key})
    assert closed.action == CLOSED
    assert closed.answers == []
    copy = verdict([first, later], first.order, 520, {first.key})
    assert copy.action == CANCEL_IT
    assert [m for m, _ in copy.answers] == [later]


# -- the book ------------------------------------------------------------------------
def test_the_book_refuses_what_no_daemon_can_do_and_answers_an_old_id_unmatched():
    book = MarkerBook(LEVELS)
    book.partition_count(LEVELS.levels[0].topic, 3)
    now = 1_764_000_000_000
    cases = {
        "3f0c6be1a7d84b6e9d9c2a51e0f7d312": UNMATCHED,
        level_id(4, 0, now): REFUSED,  # no level 4
        level_id(1, 3, now): REFUSED,  # level 1 has partitions 0-2
    }
    for offset, (mid, outcome) in enumerate(cases.items()):
        entry = book.file(cancel(now, offset, mid))
        assert entry is not None
        assert entry.refusal is not None
        assert entry.refusal[0] == outcome, mid
        assert entry.tp == book.answers_tp
        assert not book.has(mid)
    too_far = book.file(move(now, 9, now + 61_000, level_id(1, 0, now)))
    assert too_far is not None
    assert too_far.refusal is not None
    assert too_far.refusal[0] == REFUSED
    assert "top level" in too_far.refusal[1]
    assert book.file(cancel(now, 0, "3f0c6be1a7d84b6e9d9c2a51e0f7d312")) is None  # read again


def test_the_book_watches_only_the_partition_an_id_names_and_forgets_in_time():
    book = MarkerBook(LEVELS)
    mid = level_id(2, 1, 1_000)
    book.file(cancel(2_000, 0, mid))
    assert book.watch == {(LEVELS.levels[1].topic, 1): {mid.encode()}}
    assert book.kept() == {CANCEL: 1}
    assert book.expire(2_000) == 0
    assert book.expire(2_001) == 1
    assert book.watch == {}
    assert not book.has(mid)


def test_an_answer_that_does_not_fit_its_marker_changes_nothing():
    book = MarkerBook(LEVELS)
    mid = level_id(1, 0, 1_000)
    filed = move(2_000, 0, 9_000, mid)
    book.file(filed)
    forged = MarkerReply(RESCHEDULE, "someone-else", "moved", 9_000, copy="t:0")
    book.answer_read(filed.key, forged, 2_100)
    assert filed.key not in book.executed
    book.answer_read(filed.key, MarkerReply(RESCHEDULE, mid, "moved", 9_000, copy="t:0"), 2_100)
    assert filed.key in book.executed
    assert book.copies[mid] == ("t", 0)


# -- reading markers -------------------------------------------------------------------
def _record(headers, offset=4):
    return SimpleNamespace(
        timestamp=lambda: (TIMESTAMP_LOG_APPEND_TIME, 5_000),
        topic=lambda: "markers",
        partition=lambda: 0,
        offset=lambda: offset,
        headers=lambda: headers,
        set_headers=lambda _h: None,
    )


def test_markers_are_read_as_the_producer_writes_them_and_the_unreadable_refused():
    read = marker_of(_record([("delay-v", b"1"), ("delay-cancel", b"abc")]))
    assert read == (LevelMarker(CANCEL, "abc", 5_000, "markers", 0, 4), None)
    moved = marker_of(_record([("delay-reschedule", b"abc"), ("delay-ms", b"250")]))
    assert moved == (LevelMarker(RESCHEDULE, "abc", 5_000, "markers", 0, 4, 5_250), None)
    due = marker_of(_record([("delay-reschedule", b"abc"), ("delay-due-ms", b"9000")]))
    assert due is not None
    assert due[0].asked_due_ms == 9_000
    for headers, why in [
        ([("delay-cancel", b"\xff\xfe")], "not UTF-8"),
        ([("delay-cancel", b"")], "without an id"),
        ([("delay-reschedule", b"abc")], "delay-ms"),
        ([("delay-reschedule", b"abc"), ("delay-ms", b"-5")], "not a number"),
    ]:
        found = marker_of(_record(headers))
        assert found is not None
        assert found[1] is not None, headers
        assert found[1][0] == REFUSED
        assert why in found[1][1], found
    assert marker_of(_record([("trace", b"x")])) is None


# -- the gate --------------------------------------------------------------------------
def test_the_gate_moves_only_for_a_read_begun_since_the_last_rewind_and_wakes_waiters():
    gate = MarkerGate(lead_ms=10)
    assert gate.through_ms == BLOCKED
    gate.start(1_000)
    woken: list[str] = []
    gate.want(1, 2_000, lambda: woken.append("a"))
    began = gate.generation
    gate.advance(1_500, 1_500, began)
    assert (gate.through_ms, woken) == (1_500, [])
    gate.need(("t", 0), 995)  # records that need markers from 985: before what is read
    assert gate.through_ms == BLOCKED
    gate.advance(2_500, 2_500, began)  # a read that began before the rewind moves nothing
    assert gate.through_ms == BLOCKED
    assert gate.take_rewind() == (985, gate.generation)
    assert gate.covered_from_ms == 985
    gate.advance(2_500, None, gate.generation)
    assert gate.through_ms == 2_500
    assert woken == ["a"]
    assert gate.outcomes_through_ms == BLOCKED, "answers forgotten, taken as read"
    gate.advance(None, 2_600, gate.generation)
    assert gate.outcomes_through_ms == 2_600


def test_what_was_committed_lets_the_gate_forget_what_no_record_needs():
    gate = MarkerGate(lead_ms=10)
    gate.start(0)
    gate.need(("t", 0), 100)
    gate.need(("t", 1), 300)
    assert gate.earliest_need() == 90
    gate.progress(("t", 0), 500)
    assert gate.earliest_need() == 290
    gate.release([("t", 1)])
    assert gate.earliest_need() == 490
