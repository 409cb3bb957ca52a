"""Markers nothing can be decided about yet are parked: a flood of cancels of no
message is looked at once, not on every pass of the forwarder, and comes back when its
time comes, when its message is read, or when its message is done for good.

A profile of the flooded daemon (docs/performance.md) found the forwarder going over
the flooded partition's oldest markers again and again, each answering nothing before
its message could have been due, and taking the interpreter from the reader that had
the flood still to read.
"""

from __future__ import annotations

import pytest

from delayservice.forward.buffer import TP
from delayservice.level.markers import actions as marker_actions
from delayservice.level.markers.actions import CHECK_MS, LEAD_MS, SKEW_MS
from delayservice.level.markers.book import Action, MarkerBook
from delayservice.level.markers.search import EMPTY_GRACE_MS
from delayservice.level.markers.verdict import LevelMarker
from delayservice.markers.level_ids import level_id
from delayservice.markers.replies import CANCEL, CANCELLED
from tests.level.fakes import LEVEL, LEVELS, FakeClock, LevelRig, envelope_headers, message
from tests.level.markers.test_level_markers import (
    GUARANTEES,
    MARKERS,
    answers,
    cycle,
    delivered,
    marker,
    read_through,
    rig_for,
)
from tests.level.test_consumer_loop import forward, step

TP0: TP = (LEVEL.topic, 0)


def _book(count: int, now: int) -> tuple[MarkerBook, list[LevelMarker]]:
    book = MarkerBook(LEVELS)
    book.partition_count(LEVEL.topic, 3)
    filed = [
        LevelMarker(CANCEL, level_id(LEVEL.index, 0, now + n), now + n, MARKERS, 0, n)
        for n in range(count)
    ]
    for each in filed:
        book.file(each)
    return book, filed


def _keys(book: MarkerBook, now: int) -> list[bytes]:
    return sorted(e.marker.key for e in book.entries(TP0, None, now))


def _park(book: MarkerBook, markers: list[LevelMarker], until_ms: int) -> None:
    """Park `markers` as their owner does: by the entries the book gave it."""
    keys = {m.key for m in markers}
    book.park(TP0, [(e, until_ms) for e in book.entries(TP0) if e.marker.key in keys])


def test_a_parked_marker_is_left_out_until_its_time() -> None:
    book, filed = _book(4, 1_000)
    _park(book, [filed[0]], 5_000)
    _park(book, [filed[1]], 9_000)
    assert book.parked_on(TP0) == 2
    assert _keys(book, 4_999) == sorted(m.key for m in filed[2:])
    assert book.has_unresolved(TP0), "a parked marker is still to be answered"
    assert _keys(book, 5_000) == sorted(m.key for m in (filed[0], *filed[2:]))
    assert _keys(book, 9_000) == sorted(m.key for m in filed)
    assert book.parked_on(TP0) == 0


def test_a_parked_marker_comes_back_when_its_message_is_read_or_done() -> None:
    book, filed = _book(3, 1_000)
    _park(book, filed, 60_000)
    assert _keys(book, 2_000) == []
    book.unpark_named(TP0, [filed[1].message_id.encode()])
    assert _keys(book, 2_000) == [filed[1].key]
    book.apply(Action(final=[(filed[2].message_id, CANCELLED)]))
    assert _keys(book, 2_000) == sorted([filed[1].key, filed[2].key])
    book.unpark_all(TP0)
    assert _keys(book, 2_000) == sorted(m.key for m in filed)


def test_a_parked_marker_answered_or_forgotten_stays_out() -> None:
    book, filed = _book(3, 1_000)
    _park(book, filed, 5_000)
    book.apply(Action(answers=[(filed[0].key, "unmatched")]))
    assert book.parked_on(TP0) == 2
    book.expire(before_ms=1_002)  # the second is forgotten with the first
    assert book.parked_on(TP0) == 1
    assert _keys(book, 5_000) == [filed[2].key]
    assert book.parked_on(TP0) == 0


def test_parking_starts_over_when_the_book_compacts() -> None:
    """Compacting numbers the slots anew: every parked marker comes back once."""
    book = MarkerBook(LEVELS)
    book.partition_count(LEVEL.topic, 3)
    filed = []
    for n in range(600):  # every other one old: forgetting those leaves holes
        appended = 1_000 + (n % 2) * 10_000
        filed.append(
            LevelMarker(CANCEL, level_id(LEVEL.index, 0, appended), appended, MARKERS, 0, n)
        )
        book.file(filed[-1])
    kept = filed[1::2]
    _park(book, kept, 60_000)
    book.expire(before_ms=5_000)
    assert book.parked_on(TP0) == 0
    assert _keys(book, 20_000) == sorted(m.key for m in kept)


def test_an_entry_made_before_the_book_compacted_is_passed_over_by_park() -> None:
    """The owner looks, the reader's forgetting compacts, then the owner parks what it
    looked at: the slots its entries name are gone, and nothing is hidden by them."""
    book = MarkerBook(LEVELS)
    book.partition_count(LEVEL.topic, 3)
    filed = []
    for n in range(600):
        appended = 1_000 + (n % 2) * 10_000
        filed.append(
            LevelMarker(CANCEL, level_id(LEVEL.index, 0, appended), appended, MARKERS, 0, n)
        )
        book.file(filed[-1])
    looked = book.entries(TP0)
    book.expire(before_ms=5_000)
    assert book.park(TP0, [(e, 60_000) for e in looked]) == []
    assert book.parked_on(TP0) == 0
    assert _keys(book, 20_000) == sorted(m.key for m in filed[1::2])


def test_a_marker_whose_message_is_done_is_handed_back_by_park_not_parked() -> None:
    """A final state noted between the owner's look and its park: answered now, not
    hidden until its time."""
    book, filed = _book(3, 1_000)
    looked = book.entries(TP0)
    book.apply(Action(final=[(filed[1].message_id, CANCELLED)]))
    handed = book.park(TP0, [(e, 60_000) for e in looked])
    assert [(e.marker.key, final) for e, final in handed] == [(filed[1].key, CANCELLED)]
    assert book.parked_on(TP0) == 2
    assert _keys(book, 2_000) == [filed[1].key]


def _not_found_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    original = marker_actions.WorkerMarkers._not_found

    def counted(self, tp, entry, now, sender):  # type: ignore[no-untyped-def]
        calls.append(entry.marker.message_id)
        return original(self, tp, entry, now, sender)

    monkeypatch.setattr(marker_actions.WorkerMarkers, "_not_found", counted)
    return calls


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_flood_of_cancels_of_no_message_is_looked_at_once_until_it_can_be_answered(
    clock: FakeClock, exactly_once: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig: LevelRig = rig_for(clock, exactly_once)
    calls = _not_found_calls(monkeypatch)
    now = clock.ms()
    flood = [marker(rig, CANCEL, level_id(LEVEL.index, 0, now), now, n) for n in range(300)]
    for _ in range(6):  # six serve passes, each after the one before's pause
        clock.advance(CHECK_MS / 1000)
        read_through(rig)
        cycle(rig, times=1)
    assert len(calls) == 300, "each looked at once, then parked"
    assert answers(rig) == {}
    clock.advance((LEVEL.delay_ms + LEAD_MS + SKEW_MS + EMPTY_GRACE_MS) / 1000)
    read_through(rig)
    cycle(rig)
    # appended within the skew of their due time: "sent already", as without parking
    assert {answers(rig)[m.key]["outcome"] for m in flood} == {"too_late"}


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_cancel_parked_before_its_message_was_read_is_answered_once_it_is_read(
    clock: FakeClock, exactly_once: bool
) -> None:
    rig = rig_for(clock, exactly_once)
    now = clock.ms()
    mid = level_id(LEVEL.index, 0, now)  # sent now, due in the level's 5 s
    cancel = marker(rig, CANCEL, mid, now + 10, offset=0)
    read_through(rig)
    cycle(rig)
    assert rig.markers is not None
    assert rig.markers.book.parked_on(TP0) == 1
    headers = envelope_headers(message_id=mid)
    rig.consumer.append(0, message(0, 0, now, headers=headers))  # read only now
    clock.advance(CHECK_MS / 1000)
    read_through(rig)
    step(rig)
    forward(rig, commit=True)
    step(rig)
    assert clock.ms() < now + LEVEL.delay_ms, "still before its due time"
    assert answers(rig)[cancel.key]["outcome"] == "cancelled"
    clock.advance(LEVEL.delay_ms / 1000)
    read_through(rig)
    cycle(rig)
    assert delivered(rig) == []
