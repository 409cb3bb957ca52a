"""Far-future records in span files: placed by tier, split as they come near, loaded on
time and never early, and a slot read into memory under the budget, in due order."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from delayservice.precise.storage import splitter
from delayservice.precise.storage.slot_file import encode
from delayservice.precise.storage.slot_store import SlotStore
from delayservice.precise.wheel.slot_loading import LOAD_AT_MOST
from delayservice.precise.wheel.tiers import Tiers
from delayservice.precise.wheel.wheel_state import RECORD_OVERHEAD
from tests.precise.wheel.test_wheel import NOW, Rig, ms

HORIZON = 60  # tiers of 1 s, 60 s, 24 min and 12.8 h
DAY = 86_400


def spans(rig: Rig) -> list[tuple[int, int, int]]:
    return sorted(rig.store.spans())


def step_to(rig: Rig, now: float, step: float = 1.0) -> None:
    """What the splitter and loader threads do by `now`, at most `step` apart."""
    while rig.clock.now < now:
        rig.clock.now = min(now, rig.clock.now + step)
        rig.wheel.split_due_spans()
        rig.wheel._loader.load_due_slots()


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path, horizon_s=HORIZON)


def test_the_tiers_place_each_second_in_one_file_and_split_only_what_their_bounds_passed():
    tiers = Tiers.for_horizon(3600)
    assert tiers.widths == (1, 3600, 86_400, 32 * 86_400)
    bounds = tiers.boundaries(NOW)
    assert [b - NOW for b in bounds] >= [3600, 86_400, 32 * 86_400]
    assert [b % w for b, w in zip(bounds, tiers.widths[1:], strict=True)] == [0, 0, 0]
    second = int(NOW) + 10
    assert tiers.place(second, bounds) == (second, 1)
    far = int(NOW) + 200 * DAY
    start, width = tiers.place(far, bounds)
    assert width == 32 * DAY
    assert start <= far < start + width
    assert not tiers.due_for_split(start, width, bounds)
    assert tiers.due_for_split(start, width, tiers.boundaries(far - 32 * DAY))
    assert tiers.due_for_split(start, 7, bounds)  # a width no tier has: split at once


def test_a_far_record_waits_in_a_span_then_leaves_from_its_slot_on_time(rig):
    due = NOW + 100_000.25  # past tiers 1 and 2 from now: a tier-3 span
    rig.append(1, ms(100_000.25))
    rig.append(2, ms(3))
    assert rig.files() == 1  # only the near one has a slot file
    ((partition, start, width),) = spans(rig)
    assert (partition, width) == (0, 46_080)
    assert start <= due < start + width
    assert len(rig.wheel.buffer) == 1
    assert rig.wheel.loaded_slots == 1
    assert rig.store.earliest() == {0: ms(3) // 1000}
    step_to(rig, NOW + 4)
    assert rig.take() == [2]
    assert rig.store.earliest() == {0: start}  # the span counts
    widths_seen = set()
    while rig.clock.now < due - 10:
        step_to(rig, min(rig.clock.now + 600, due - 10), step=30)
        widths_seen.update(w for _, _, w in spans(rig))
        assert rig.take() == []  # never early
    assert widths_seen == {46_080, 1_440, 60}  # down every tier
    assert spans(rig) == []
    assert rig.files() == 1
    step_to(rig, due - 0.01)
    assert rig.take() == []
    rig.clock.now = due
    assert rig.take() == [1]
    assert rig.files() == 0
    assert rig.store.file_count() == 0


def test_a_split_killed_half_way_leaves_no_loss_and_no_duplicate(tmp_path, monkeypatch):
    rig = Rig(tmp_path, horizon_s=HORIZON)
    base = NOW + 200  # tier 1: 60 s spans
    for offset in range(300):
        rig.append(offset, int((base + offset % 50 + 0.5) * 1000), sync=False)
    rig.store.sync()
    assert {w for _, _, w in spans(rig)} == {60}
    monkeypatch.setattr(splitter, "CHUNK", 4000)  # many chunks per span
    real_place = rig.wheel._splitting._place
    calls = 0

    def dies_after_two_chunks(span, by_second):
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("killed")
        real_place(span, by_second)

    monkeypatch.setattr(rig.wheel._splitting, "_place", dies_after_two_chunks)
    rig.clock.now = base - 50
    with pytest.raises(RuntimeError):
        rig.wheel.split_due_spans()
    assert rig.files() > 0
    assert spans(rig)
    rig.store.sync()  # the page cache outlives the process
    rig.store.close()
    rig.cancels.close()
    again = Rig(tmp_path, now=base - 50, horizon_s=HORIZON)
    sent: list[int] = []
    while again.clock.now < base + 60:
        step_to(again, again.clock.now + 0.5)
        sent.extend(again.take())
    assert sorted(sent) == list(range(300))  # each once
    assert again.store.file_count() == 0


def test_a_cancelled_record_rides_along_the_split_and_is_dropped_when_its_slot_loads(rig):
    for offset in (1, 2, 3):
        rig.append(offset, ms(5_000 + offset))
    assert not rig.files()
    assert spans(rig)
    assert rig.wheel.cancel("id-2", ms(10_000)) == "pending"
    sent: list[int] = []
    while rig.clock.now < NOW + 5_004:
        step_to(rig, rig.clock.now + 1)
        sent.extend(rig.take())
    assert sent == [1, 3]
    assert rig.outcomes.counts["cancelled"] == 1
    rig.wheel.write_marks()
    assert "id-2" not in rig.cancels


def test_files_and_memory_stay_bounded_however_far_out_records_are(tmp_path):
    rng = random.Random(7)
    sizes = {}
    for name, reach in (("a week", 7 * DAY), ("a year", 366 * DAY)):
        rig = Rig(tmp_path / name)  # the default horizon: 1 h, 1 d, 32 d spans
        batch = [
            (p, ms(rng.uniform(2 * 3600, reach)), encode(rig.stored(i, 0)))
            for i in range(6000)
            for p in (i % 3,)
        ]
        assert rig.wheel.append_many(batch) == [None] * len(batch)
        rig.store.sync()
        # Per partition: nothing within 2 h, at most 48 hour and 64 day spans, and one
        # per 32 days of reach.
        assert rig.store.file_count() <= 3 * (48 + 64 + 13)
        assert rig.wheel.loaded_slots == 0
        assert len(rig.wheel.buffer) == 0
        assert rig.wheel._state.unloaded == []
        assert rig.wheel._state.trackers == {}
        sizes[name] = rig.store.file_count()
        # A restart scans exactly those files, whatever they hold.
        rig.store.close()
        assert SlotStore(tmp_path / name / "slots").file_count() == sizes[name]
    assert sizes["a year"] <= 3 * (48 + 64 + 13)


def test_one_write_per_file_per_batch(rig, monkeypatch):
    from delayservice.precise.storage import slot_store

    writes: list[int] = []
    real = slot_store._write_all

    def counted(fd, data):
        writes.append(len(data))
        real(fd, data)

    monkeypatch.setattr(slot_store, "_write_all", counted)
    batch = [(0, ms(10 + i % 3), encode(rig.stored(i, 0))) for i in range(300)]
    batch += [(0, ms(40 * DAY + i), encode(rig.stored(1000 + i, 0))) for i in range(200)]
    rig.wheel.append_many(batch)
    assert len(writes) == 4  # three slots and one span


def test_a_slot_bigger_than_the_budget_leaves_in_due_order_under_it(tmp_path):
    per_record = len(encode(Rig(tmp_path / "x").stored(0, 0))) + RECORD_OVERHEAD
    budget = per_record * 3000  # the index of 12,000 records takes about 800 of it
    rig = Rig(tmp_path / "wheel", max_buffered_bytes=budget)
    rng = random.Random(3)
    order = list(range(12_000))
    rng.shuffle(order)
    dues = {offset: ms(30) // 1000 * 1000 + rng.randrange(1000) for offset in order}
    for offset in order:
        rig.append(offset, dues[offset], sync=False)
    rig.append(order[0], dues[order[0]], sync=True)  # written twice: sent once
    rig.clock.now = NOW + 25
    rig.wheel._loader.load_due_slots()
    assert len(rig.wheel.buffer) <= 3000  # the slot is indexed, not read whole
    assert rig.wheel.held_bytes <= budget
    sent: list[int] = []
    peak = 0
    while rig.clock.now < NOW + 32:
        rig.clock.now += 0.05
        rig.wheel._loader.load_due_slots()
        peak = max(peak, rig.wheel.held_bytes)
        sent.extend(rig.take())
    assert sorted(sent) == sorted(order)  # all, once
    assert [dues[o] for o in sent] == sorted(dues[o] for o in sent)  # in due order
    # Never above the budget plus one step of records already due.
    assert peak <= budget + per_record * LOAD_AT_MOST // 10
    assert rig.files() == 0
    assert rig.wheel.held_bytes == 0


def test_a_record_bigger_than_a_read_chunk_is_indexed_and_split_whole(rig, monkeypatch):
    from delayservice.precise.storage import slot_index

    monkeypatch.setattr(slot_index, "CHUNK", 1000)
    monkeypatch.setattr(splitter, "CHUNK", 1000)
    big = rig.stored(2, ms(200.5))._replace(value=b"v" * 5000)
    rig.wheel.append(0, ms(200.5), encode(big))
    rig.append(1, ms(200.2))
    rig.append(3, ms(200.9))
    assert {w for _, _, w in spans(rig)} == {60}
    sent: list[int] = []
    while rig.clock.now < NOW + 201:
        step_to(rig, rig.clock.now + 0.5)
        sent.extend(rig.take())
    assert sent == [1, 2, 3]
