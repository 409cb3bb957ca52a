"""Markers are filed a run at a time (issue 46): the reader files what one consume
returned at one hold of the book's lock per slice, where it took the lock, and moved the
book's version, once per marker. A profile of a flooded daemon had the reader waiting
for that lock, against the forwarder, for an eighth of its time.

A run must keep exactly what one-by-one filing keeps, and one marker that cannot be
filed must cost the others nothing.
"""

from __future__ import annotations

import logging

import pytest

from delayservice.level.markers.book import FILE_SLICE, MarkerBook
from delayservice.level.markers.placing import Placing
from delayservice.level.markers.verdict import LevelMarker
from delayservice.markers.level_ids import level_id
from delayservice.markers.replies import CANCEL, RESCHEDULE
from tests.level.fakes import LEVEL, LEVELS
from tests.level.markers.reading import Reading, cancel_on, reading_rig

MARKERS = "delay_markers"
NOW = 1_000_000


def _mixed() -> list[tuple[LevelMarker, tuple[str, str] | None]]:
    """Cancels and moves of level ids, ids of no level, partitions past the count, a
    move too far ahead, a refusal read off the record, and one record read twice."""
    read: list[tuple[LevelMarker, tuple[str, str] | None]] = []
    for n in range(3 * FILE_SLICE + 7):
        kind = RESCHEDULE if n % 5 == 0 else CANCEL
        if n % 11 == 0:
            mid = f"plain-{n}"
        elif n % 13 == 0:
            mid = level_id(LEVEL.index, 7, NOW)  # the level topic has 3 partitions
        else:
            mid = level_id(LEVEL.index, n % 3, NOW + n)
        asked = NOW + (10_000_000 if n % 17 == 0 else 500) if kind == RESCHEDULE else None
        refusal = ("refused", "its headers cannot be read") if n % 19 == 0 else None
        read.append((LevelMarker(kind, mid, NOW + n, MARKERS, n % 2, n, asked), refusal))
    read.append(read[40])  # read again after a rewind: kept once
    return read


def _book() -> MarkerBook:
    book = MarkerBook(LEVELS)
    book.partition_count(LEVEL.topic, 3)
    return book


def _kept(book: MarkerBook) -> list[tuple[object, ...]]:
    entries = sorted(book.all_entries(), key=lambda e: e.marker.key)
    return [(e.marker, e.tp, e.refusal, e.sent_ms, e.delay_ms, e.slot) for e in entries]


def test_a_run_keeps_what_filing_one_by_one_keeps() -> None:
    read = _mixed()
    one_by_one, run = _book(), _book()
    for marker, refusal in read:
        one_by_one.file(marker, refusal)
    assert run.file_run(read) == []
    assert _kept(run) == _kept(one_by_one)
    assert run.kept() == one_by_one.kept()
    assert run.total_bytes == one_by_one.total_bytes
    assert run.watch_dict() == one_by_one.watch_dict()
    assert run.version == -(-len(read) // FILE_SLICE), "one version step per slice"
    assert run.file_run(read[:FILE_SLICE]) == []
    assert run.version == -(-len(read) // FILE_SLICE), "nothing new: the owners not asked"
    assert _kept(run) == _kept(one_by_one)


def test_a_marker_that_cannot_be_filed_costs_the_others_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read = _mixed()
    bad = read[5][0]
    book = _book()
    entry_of = Placing.entry

    def failing(self: Placing, marker: LevelMarker, refusal: object) -> object:
        if marker is bad:
            raise ValueError("a marker no filing expected")
        return entry_of(self, marker, refusal)  # type: ignore[arg-type]

    monkeypatch.setattr(Placing, "entry", failing)
    failed = book.file_run(read)
    assert [(m, type(e)) for m, e in failed] == [(bad, ValueError)]
    monkeypatch.undo()
    expected = _book()
    expected.file_run([r for r in read if r[0] is not bad])
    assert _kept(book) == _kept(expected)


@pytest.fixture
def reading(monkeypatch: pytest.MonkeyPatch) -> Reading:
    return reading_rig(monkeypatch)


def test_the_reader_counts_a_marker_it_cannot_file_and_reads_on(
    reading: Reading, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ids = [cancel_on(reading, 0, names=n % 3) for n in range(5)]
    entry_of = Placing.entry

    def failing(self: Placing, marker: LevelMarker, refusal: object) -> object:
        if marker.message_id == ids[2]:
            raise ValueError("a marker no filing expected")
        return entry_of(self, marker, refusal)  # type: ignore[arg-type]

    monkeypatch.setattr(Placing, "entry", failing)
    errors = reading.reader._m_errors
    before = errors._value.get()
    through = reading.gate.through_ms
    with caplog.at_level(logging.ERROR, logger="delayservice.level.markers.filing"):
        reading.one_pass()
    assert errors._value.get() == before + 1
    assert "could not be read" in caplog.text
    assert "a marker no filing expected" in caplog.text
    kept = {e.marker.message_id for e in reading.book.all_entries()}
    assert kept == set(ids) - {ids[2]}
    assert reading.gate.through_ms > through, "the reader stopped moving the gate"
