"""The level marker book is compact and bounded (issue 46, "a compact, bounded book"):

- a marker costs a small fraction of the ~750 B (tracemalloc; ~1.1 KB of RSS) it cost
  as objects in dictionaries, and the book counts about what it holds;
- the book is counted in the memory budget, with a share of its own;
- a book at its share pauses the markers partitions and holds the gate (records wait:
  late, no cancel forgotten), says so in readiness and a gauge, lets go of the markers
  whose committed answer decides nothing, and then reads on: the cancel that came
  after the flood is read and kept, a cancel answered `cancelled` is kept throughout.
"""

from __future__ import annotations

import gc
import json
import time
import tracemalloc

import pytest
from prometheus_client import CollectorRegistry

from delayservice.level.markers import reader as marker_reader
from delayservice.level.markers.book import MarkerBook
from delayservice.level.markers.level_markers import BOOK_SHARE, LevelMarkers
from delayservice.level.markers.verdict import LevelMarker
from delayservice.level.memory_budget import MemoryBudget
from delayservice.levels import LevelSet
from delayservice.markers.level_ids import level_id
from delayservice.markers.replies import CANCEL, reply_key
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.settings_loading import load_settings
from tests.level.fakes import message
from tests.level.markers.reading import Reading, cancel_on, reading_rig

LEVELS = LevelSet.parse("5s,1m,1h")


def _file_flood(book: MarkerBook, count: int, now: int) -> None:
    for n in range(count):
        mid = level_id(1 + n % 3, n % 6, now)
        book.file(LevelMarker(CANCEL, mid, now, "delay_markers", n % 2, n // 2))


def test_a_marker_costs_a_small_fraction_of_what_objects_in_dictionaries_did() -> None:
    now = int(time.time() * 1000)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        book = MarkerBook(LEVELS)
        _file_flood(book, 20_000, now)
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    per_marker = traced / 20_000
    assert per_marker < 150, f"{per_marker:.0f} B per marker kept"
    counted = book.measure() / 20_000
    assert 0.7 * per_marker <= counted <= 1.5 * per_marker, (counted, per_marker)


def test_the_book_is_counted_in_the_memory_budget_with_a_share_of_its_own() -> None:
    settings = load_settings(levels="5s,1m", bootstrap_servers="127.0.0.1:9")
    budget = MemoryBudget(64 * 2**20)
    markers = LevelMarkers(settings, ServiceMetrics(CollectorRegistry()), lambda: 0, budget=budget)
    assert markers.book.max_bytes == int(64 * 2**20 * BOOK_SHARE)
    empty = budget.used
    _file_flood(markers.book, 5_000, int(time.time() * 1000))
    markers.book.measure()
    assert budget.used - empty == markers.book.total_bytes > 5_000 * 50


def _answer(reading: Reading, offset: int, mid: str, outcome: str) -> None:
    outcomes = (reading.outcomes, 0)
    reply = {"v": 1, "kind": "cancel", "id": mid, "outcome": outcome}
    record = message(
        0,
        reading.fake.next_offset(outcomes),
        reading.clock.ms(),
        topic=reading.outcomes,
        key=reply_key(reading.markers, 0, offset),
        value=json.dumps(reply).encode(),
    )
    reading.fake.append(outcomes, record)


def test_a_full_book_holds_the_gate_and_reads_on_once_answers_let_it_shed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reading = reading_rig(monkeypatch)
    monkeypatch.setattr(marker_reader, "BATCH", 50)
    reader, book, gate = reading.reader, reading.book, reading.gate
    reader._thread.is_alive = lambda: True  # type: ignore[method-assign]
    full = reader._metrics.level_markers_book_full
    markers_tp = (reading.markers, 0)
    kept_offset = reading.fake.next_offset(markers_tp)
    kept = cancel_on(reading, 0)  # a cancel carried out: answered `cancelled`
    _answer(reading, kept_offset, kept, "cancelled")
    reading.one_pass()
    assert book.has(kept)
    book.max_bytes = book.measure() + 20_000  # room for about 200 more markers
    for _ in range(600):
        cancel_on(reading, 0)
    late = cancel_on(reading, 0)  # acknowledged after the flood, before its message's due time
    through = gate.through_ms
    reading.one_pass()

    assert gate.through_ms == through, "the gate moved past markers the book had no room for"
    assert not book.has(late)
    assert markers_tp in reading.fake.paused_tps
    ready, why = reader.health()
    assert not ready
    assert "the book of markers is at its share of the memory budget" in why
    assert full._value.get() == 1
    reading.one_pass()  # still full: nothing read, nothing forgotten
    assert gate.through_ms == through
    assert book.has(kept)

    answered = set()
    for _ in range(10):  # the owners answer the flood as it is read: no such messages
        for entry in book.keys.values():
            if entry.marker.message_id != kept and entry.marker.offset not in answered:
                _answer(reading, entry.marker.offset, entry.marker.message_id, "unmatched")
                answered.add(entry.marker.offset)
        reading.one_pass()
        if book.has(late):
            break
    assert book.has(late), "the cancel after the flood was never read"
    assert book.has(kept), "a cancel answered cancelled was let go"
    assert gate.through_ms > through
    assert markers_tp not in reading.fake.paused_tps
    assert reader.health() == (True, "markers: read")
    assert full._value.get() == 0
    assert book.shed_count > 0


def _observe(book: MarkerBook, ids: list[str], keys: list[bytes], tps: list[tuple[str, int]]):
    return (
        [(book.has(m), book.final.get(m), book.has_reschedule(m)) for m in ids],
        [book.verdict_for(m, None, 10_000_000) for m in ids],
        [(book.is_answered(k), k in book.executed, k in book.keys) for k in keys],
        [sorted(e.marker.key for e in book.entries(tp)) for tp in tps],
        [book.named(tp, [m.encode() for m in ids]) for tp in tps],
        book.kept(),
        book.watch.as_dict(),
    )


def test_forgetting_cutting_and_compacting_change_no_answer_about_what_is_kept() -> None:
    from delayservice.level.markers.book import Action
    from delayservice.markers.replies import RESCHEDULE, MarkerReply

    book = MarkerBook(LEVELS)
    ids = [level_id(1 + n % 3, n % 4, 1_000) for n in range(700)] + ["not-a-level-id"]
    keys = []
    for n in range(6000):
        mid = ids[(n * 7) % len(ids)]
        kind = RESCHEDULE if n % 5 == 0 else CANCEL
        asked = 2_000 + n if kind == RESCHEDULE else None
        marker = LevelMarker(kind, mid, 1_000 + n, "delay_markers", n % 3, n, asked)
        book.file(marker)
        keys.append(marker.key)
        if n % 4 == 0:
            book.apply(Action(answers=[(marker.key, "unmatched")]))
        if n % 11 == 0:
            book.answer_read(marker.key, MarkerReply(kind, mid, "cancelled", 0), 1_000 + n)
        if kind == RESCHEDULE and n % 3 == 0:
            book.answer_read(marker.key, MarkerReply(kind, mid, "moved", 9, copy="t:1"), 1_000 + n)
    tps = [(level.topic, p) for level in LEVELS.levels for p in range(4)]
    assert book.expire(1_000 + 3_000) == 3_000  # the front: forgotten, then cut away
    before = _observe(book, ids, keys, tps)
    assert book._cols.base > 0, "the forgotten front was not cut"
    book._compact()
    assert _observe(book, ids, keys, tps) == before
    assert book.expire(1_000 + 6_000) == 3_000
    assert book.kept() == {}
    assert book.watch.get(tps[0]) is None


def test_a_flood_is_served_a_batch_at_a_time_round_all_of_it() -> None:
    from delayservice.level.markers.book import Action

    book = MarkerBook(LEVELS)
    tp = (LEVELS.levels[0].topic, 0)
    for n in range(1000):
        book.file(LevelMarker(CANCEL, level_id(1, 0, 1_000), 1_000, "delay_markers", 0, n))
    first = book.entries(tp, 300)
    assert len(first) == 300
    book.apply(Action(answers=[(e.marker.key, "unmatched") for e in first[:100]]))
    seen = {e.marker.key for e in first}
    for _ in range(3):
        batch = book.entries(tp, 300)
        assert len(batch) == 300
        seen |= {e.marker.key for e in batch}
    assert len(seen) == 1000, "a batch at a time never came round to some markers"
    assert len(book.entries(tp)) == 900


def test_a_backlog_read_beside_a_live_partition_is_forgotten_by_append_time() -> None:
    """Markers partition 1 is read live while partition 0's backlog (a flood after a
    restart) is read behind it: nearly every marker of 0 is filed after a later one
    of 1, a straggler. Each is forgotten once what is forgotten passes its own append
    time, neither before nor never, across a compaction."""
    book = MarkerBook(LEVELS)
    backlog = [(1_000 + n, n) for n in range(3_000)]  # (appended, offset) on partition 0
    live = [(4_000 + n, n) for n in range(0, 3_000, 3)]  # partition 1, appended later
    ids = {}
    for step, (appended, offset) in enumerate(backlog):
        if step % 3 == 0:
            ms, at = live[step // 3]
            mid = level_id(1, 1, ms)
            book.file(LevelMarker(CANCEL, mid, ms, "delay_markers", 1, at))
            ids[mid] = ms
        mid = level_id(1, 0, appended)
        book.file(LevelMarker(CANCEL, mid, appended, "delay_markers", 0, offset))
        ids[mid] = appended
    assert sum(book.kept().values()) == 4_000
    assert book.expire(2_500) == 1_500
    book._compact()
    assert book.expire(4_000) == 1_500  # the rest of the backlog, nothing of the live one
    assert {m for m in ids if book.has(m)} == {m for m, ms in ids.items() if ms >= 4_000}
    assert book.expire(4_000 + 1_500) == 500
    assert {m for m in ids if book.has(m)} == {m for m, ms in ids.items() if ms >= 5_500}
