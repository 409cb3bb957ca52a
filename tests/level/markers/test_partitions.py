"""The markers topic partitioned like the levels: a marker goes to the markers partition
of its level partition, and the gate is kept per markers partition, so a flood of
markers on one holds back only the records whose markers go there.

On fakes, one step at a time: the gate alone, the reader over a markers topic of three
partitions with one of them not read to its end (a flood the pass cannot get through),
and a partition group taking records of two level partitions behind that gate."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from delayservice.level.markers import reader as marker_reader
from delayservice.level.markers.actions import WorkerMarkers
from delayservice.level.markers.book import MarkerBook
from delayservice.level.markers.gate import BLOCKED, OLD_COUNT_MS, MarkerGate
from delayservice.level.partition_group import PartitionGroup
from delayservice.levels import LevelSet
from delayservice.metrics.service_metrics import ServiceMetrics
from tests.level.fakes import FakeClock, message
from tests.level.markers.reading import Reading, cancel_on, reading_rig

LEAD_MS = 100
GREW_MS = 10_000


def _gate(counts: tuple[int, ...] = (3,)) -> MarkerGate:
    gate = MarkerGate(LEAD_MS)
    gate.start(0)
    for count in counts:
        gate.markers_count(count, GREW_MS)
    gate.read_parts(list(range(max(counts))), [0])
    return gate


def test_a_partition_read_through_opens_only_the_records_whose_markers_go_there():
    gate = _gate()
    gate.advance_parts({1: 2_000, 2: 2_000}, {0: 2_000}, gate.generation)
    # Nothing goes until every partition was read once: a marker may be anywhere.
    assert [gate.through_for(p) for p in range(6)] == [BLOCKED] * 6
    gate.advance_parts({0: 1_000}, {}, gate.generation)
    assert gate.through_ms == 1_000
    gate.advance_parts({1: 5_000}, {}, gate.generation)
    assert [gate.through_for(p) for p in range(6)] == [1_000, 5_000, 2_000] * 2


def test_a_partition_an_id_names_is_read_as_its_own_and_never_kept():
    """A copy's id is written by whoever may write a level topic: the partitions it
    names are answered as the daemon's own are, and the gate keeps none of them."""
    gate = _gate()
    gate.advance_parts({0: 1_000, 1: 5_000, 2: 2_000}, {0: 2_000}, gate.generation)
    kept = dict(gate._homes)
    named = [4, 2**31 - 1, *range(10_000, 20_000)]
    assert [gate.through_named(p) for p in named[:2]] == [5_000, 5_000]
    assert all(gate.through_named(p) == gate.through_for(p % 3) for p in named[2:12])
    for partition in named:
        gate.through_named(partition)
    gate.want(7, 9_000, lambda: None, partition=2**31 - 1)
    gate.advance_parts({1: 9_000}, {}, gate.generation)
    assert {p for p in gate._homes if p not in kept} <= {0, 1, 2}


def test_a_wish_for_one_partition_is_woken_by_that_partition_alone():
    gate = _gate()
    gate.advance(1_000, 1_000, gate.generation)
    woken: list[str] = []
    gate.want(7, 3_000, lambda: woken.append("p1"), partition=1)
    gate.want(7, 3_000, lambda: woken.append("p0"), partition=0)
    gate.advance_parts({0: 2_500, 2: 9_000}, {}, gate.generation)
    assert woken == []
    gate.advance_parts({1: 3_000}, {}, gate.generation)
    assert woken == ["p1"], "level partition 1 waits on markers partition 1 only"
    assert gate.next_wanted_ms() == 3_000
    gate.want(7, 3_500, lambda: woken.append("p0 later"), partition=0)
    assert gate.next_wanted_ms() == 3_000, "an earlier wish of a partition stands"
    gate.advance_parts({0: 3_000}, {}, gate.generation)
    assert woken == ["p1", "p0"]


def test_an_earlier_count_holds_for_the_markers_of_producers_not_told_yet():
    gate = _gate(counts=(1, 3))  # grown from 1 to 3 at GREW_MS
    assert gate.home_of(4) == (0, 1)
    gate.advance_parts({0: 1_000, 1: 3_000, 2: 2_000}, {0: 1_000}, gate.generation)
    assert gate.through_for(4) == 1_000, "partition 0 may hold its markers: old producers"
    until = GREW_MS + OLD_COUNT_MS
    gate.advance_parts({0: until, 1: until + 5_000, 2: until + 5_000}, {}, gate.generation)
    assert gate.through_for(4) == until + 5_000, "read past when old producers could write"
    assert gate.through_for(0) == until  # its own home under the count now


def test_a_move_waits_until_its_messages_other_markers_partitions_are_read_past_it():
    """A reschedule read on one home may be preceded by a cancel on another (the topic
    grown, an older SDK): it is carried out once those are read past its time."""
    gate = _gate(counts=(1, 3))  # grown from 1 to 3 at GREW_MS: partition 4 -> 1, was 0
    gate.advance_parts({0: 1_000, 1: 9_000, 2: 9_000}, {0: 9_000}, gate.generation)
    assert not gate.read_before(4, 5_000, on=1), "a cancel may wait on partition 0"
    assert gate.read_before(4, 999, on=1)
    gate.advance_parts({0: 5_000}, {}, gate.generation)
    assert not gate.read_before(4, 5_000, on=1), "a marker of that millisecond may be there"
    gate.advance_parts({0: 5_001}, {}, gate.generation)
    assert gate.read_before(4, 5_000, on=1)
    assert gate.read_before(1, 5_000, on=1), "one home: read in order"
    assert not gate.read_before(4, 9_500, on=0), "read on the old home: the new one too"
    until = GREW_MS + OLD_COUNT_MS
    gate.advance_parts({0: until}, {}, gate.generation)
    assert gate.read_before(4, until + 5_000, on=1), "past when old producers could write"
    gate.need(("delay_topic_2", 4), -10_000)  # a rewind: shut
    assert not gate.read_before(4, 100, on=1)


def test_a_misplaced_marker_adds_its_partition_to_the_homes():
    gate = _gate()
    gate.misplaced(4, 2)  # an older SDK put one of partition 4's markers on 2
    assert gate.home_of(4) == (1, 2)
    gate.advance_parts({0: 9_000, 1: 3_000, 2: 2_000}, {0: 1_000}, gate.generation)
    assert gate.through_for(4) == 2_000
    assert gate.through_for(1) == 3_000


def test_a_rewind_shuts_every_partition_until_each_was_read_again():
    gate = _gate()
    gate.advance(1_000, 1_000, gate.generation)
    gate.forget_before(800)
    gate.need(("level", 1), 500)  # older records than the reader covers
    assert gate.take_rewind() is not None
    assert [gate.through_for(p) for p in range(3)] == [BLOCKED] * 3
    gate.advance_parts({1: 2_000, 2: 2_000}, {}, gate.generation)
    assert gate.through_for(1) == BLOCKED, "opened before partition 0 was read again"
    gate.advance_parts({0: 2_000}, {}, gate.generation)
    assert [gate.through_for(p) for p in range(3)] == [2_000] * 3


@pytest.fixture
def reading(monkeypatch: pytest.MonkeyPatch) -> Reading:
    rig = reading_rig(monkeypatch, markers_partitions=3)
    assert [rig.gate.through_for(p) for p in range(3)] == [rig.clock.ms()] * 3
    return rig


def test_a_markers_partition_the_reader_cannot_get_through_holds_back_its_records_only(
    reading: Reading,
) -> None:
    flooded = (reading.markers, 0)
    mid = cancel_on(reading, 0, names=0)
    acknowledged = reading.clock.ms()
    reading.fake.paused_tps.add(flooded)  # its records are not fetched: a flood unread
    for _ in range(3):
        reading.one_pass()
    # Read through a time means every marker appended before it was read.
    assert reading.gate.through_for(0) <= acknowledged, "passed a cancel it has not read"
    assert reading.gate.through_for(3) <= acknowledged  # 3 % 3: the same markers partition
    for partition in (1, 2, 4):
        assert reading.gate.through_for(partition) > acknowledged, (
            f"level partition {partition}'s records wait for markers partition 0's flood"
        )
    assert not reading.book.has(mid)
    reading.fake.paused_tps.clear()
    reading.one_pass()
    assert reading.book.has(mid)
    assert reading.gate.through_for(0) > acknowledged


def test_a_marker_on_another_partition_than_its_level_partitions_is_told_and_waited_for(
    reading: Reading, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="delayservice.level.markers.filing")
    cancel_on(reading, 2, names=1)  # an older SDK: by a hash of the id
    reading.one_pass()
    assert reading.gate.home_of(1) == (1, 2)
    (line,) = [r.getMessage() for r in caplog.records if "level partition 1" in r.getMessage()]
    assert f"was on {reading.markers} partition 2, not [1]" in line
    cancel_on(reading, 2, names=1)
    reading.one_pass()
    assert len(caplog.records) == 1, "told once"


def _group_behind(gate: MarkerGate, clock: FakeClock) -> tuple[PartitionGroup, str]:
    levels = LevelSet.parse("1s")
    topic = levels.levels[0].topic
    markers = WorkerMarkers(
        "w",
        MarkerBook(levels),
        gate,
        levels,
        "outcomes",
        ServiceMetrics(CollectorRegistry()),
        clock.ms,
        cancel_lead_ms=LEAD_MS,
    )
    group = PartitionGroup([(topic, 1_000, 0)], clock.time, markers=markers)
    return group, topic


def _sleeping_group(*partitions: int) -> tuple[FakeClock, MarkerGate, PartitionGroup, str]:
    """A group of partitions 0 and 1 behind a gate, a record due in a second on each of
    `partitions`, and the clock half a second past their due time."""
    clock = FakeClock()
    gate = _gate()
    group, topic = _group_behind(gate, clock)
    now = clock.ms()
    for partition in (0, 1):
        group.assign((topic, partition))
    for partition in partitions:
        group.add((topic, partition), [message(partition, 0, now, topic=topic)], 1, now)
    clock.advance(1.5)
    return clock, gate, group, topic


def test_a_group_takes_the_records_of_partitions_read_through_and_waits_for_the_rest():
    clock, gate, group, _ = _sleeping_group(0, 1)
    now = clock.ms() - 1_500
    gate.advance(now + 200, now + 200, gate.generation)  # every partition, before the due time
    gate.advance_parts({1: clock.ms()}, {}, gate.generation)  # only 1 read past it
    taken = group.take(100)
    assert [(tp[1], len(run)) for tp, run in taken] == [(1, 1)]
    # The forwarder sleeps with no deadline of its own: only the reader wakes it.
    sleeper = threading.Thread(target=group.wait, args=(clock.time() + 3_600,), daemon=True)
    sleeper.start()
    sleeper.join(0.3)
    assert sleeper.is_alive(), "a due head whose markers are not read was taken as ready"
    gate.advance_parts({2: clock.ms()}, {}, gate.generation)
    sleeper.join(0.3)
    assert sleeper.is_alive(), "woken by another partition's reading"
    gate.advance_parts({0: clock.ms()}, {}, gate.generation)
    sleeper.join(5)
    assert not sleeper.is_alive(), "the reader's move of partition 0 did not wake the group"
    assert [(tp[1], len(run)) for tp, run in group.take(100)] == [(0, 1)]


def test_markers_naming_partitions_no_level_topic_has_leave_the_gate_as_it_was(
    reading: Reading,
) -> None:
    """Ids from outside name any partition: one that no level topic has concerns no
    record, and must not grow what the gate keeps per level partition."""
    for n in range(50):
        cancel_on(reading, 2, names=1_000_000 + n)  # well-formed, on a partition none has
    reading.one_pass()
    assert reading.gate._extra == {}
    assert all(p < 3 for p in reading.gate._homes), sorted(reading.gate._homes)


def test_a_run_of_a_partition_read_through_wakes_a_group_sleeping_behind_another():
    """Partition 0's markers lag (a flood), so its due head waits; the forwarder sleeps
    for the reader. A run of partition 1, whose markers are read, handed over then must
    wake it: it was compared with the earliest head, which is 0's, and slept on until
    partition 0's markers were read (found by the level simulation's sleeping
    forwarder)."""
    clock, gate, group, topic = _sleeping_group(0)
    now = clock.ms() - 1_500
    gate.advance(now + 200, now + 200, gate.generation)
    gate.advance_parts({1: clock.ms(), 2: clock.ms()}, {}, gate.generation)
    assert group.take(100) == []  # 0's head is due, and waits for its markers
    sleeper = threading.Thread(target=group.wait, args=(clock.time() + 3_600,), daemon=True)
    sleeper.start()
    sleeper.join(0.3)
    assert sleeper.is_alive()
    later = clock.ms() - 1_000  # appended a level ago: due now, before partition 1's reading
    group.add((topic, 1), [message(1, 0, later, topic=topic)], 1, later)
    sleeper.join(5)
    assert not sleeper.is_alive(), "a run that may go at once left the forwarder asleep"
    assert [(tp[1], len(run)) for tp, run in group.take(100)] == [(1, 1)]


def test_a_flood_that_goes_on_after_a_pass_noted_its_targets_does_not_hold_the_pass(
    reading: Reading, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass reads what else is queued once its targets are reached. A flood that began
    after they were noted kept that queue full, and drained to its end it held every
    partition's gate until the flood was read: in half the runs of
    `benchmarks/marker_flood.py --flood-partition 0`, every partition's records waited
    for the flood. The pass now ends after a moment of it."""
    monkeypatch.setattr(marker_reader, "IDLE_PASS_S", 0.0)  # one batch of what is queued
    flood, written = 20_000, [0]
    consume = reading.fake.consume

    def flooding(num_messages: int = 1, timeout: float = -1) -> list[Any]:
        while written[0] < flood and written[0] % 1_000 < 999:
            cancel_on(reading, 0)
            written[0] += 1
        written[0] += 1
        return consume(num_messages, timeout)

    reading.fake.consume = flooding  # type: ignore[method-assign]
    reading.one_pass()
    began = reading.clock.ms()
    read = reading.reader._read_to.get((reading.markers, 0), 0)
    assert read < flood // 2, f"the pass read {read} markers of a flood that began after it"
    assert [reading.gate.through_for(p) for p in (1, 2)] == [began, began]
