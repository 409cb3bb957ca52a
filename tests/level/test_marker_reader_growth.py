"""Partitions added to the markers topic or its outcomes topic while the reader runs
(an operator grew the topic; the SDK then spreads markers over every partition it
has): the reader assigns them from their beginning, and the gate does not move past a
pass's time until they were read to their end as of that pass. It says so once, at
WARNING. The reader runs on the test's own thread, one pass at a time, over fakes: its
reading consumer, which knows of the partitions it listed itself (librdkafka's metadata
cache), and the second one it lists the topics with."""

from __future__ import annotations

import logging

import pytest

from delayservice.level import marker_reader
from tests.level.fakes import message
from tests.level.marker_reading import Reading, cancel_on, reading_rig


@pytest.fixture
def reading(monkeypatch: pytest.MonkeyPatch) -> Reading:
    return reading_rig(monkeypatch)


def _grew(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "grew" in r.getMessage()
    ]


def test_a_marker_on_a_partition_added_while_reading_is_read_before_the_gate_passes_it(
    reading: Reading, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="delayservice.level.marker_reader")
    reading.grow(reading.markers, 4)
    mid = cancel_on(reading, 3)
    acknowledged = reading.clock.ms()
    before = reading.gate.through_ms
    # The new partition's records are not fetched yet: the pass cannot finish.
    reading.fake.paused_tps.add((reading.markers, 3))
    reading.one_pass()
    assert reading.gate.through_ms == before, (
        f"the gate moved to {reading.gate.through_ms}, past a cancel acknowledged at "
        f"{acknowledged} on a partition it has not read"
    )
    reading.fake.paused_tps.clear()
    reading.one_pass()
    assert reading.book.has(mid), (
        f"the gate is at {reading.gate.through_ms}, past a cancel acknowledged at "
        f"{acknowledged} on a partition added while it ran, and that cancel was never read"
    )
    assert reading.gate.through_ms > acknowledged
    later = cancel_on(reading, 2)
    reading.one_pass()
    assert reading.book.has(later)
    (line,) = _grew(caplog)
    assert f"{reading.markers} grew from 1 to 4 partitions" in line


def test_the_outcomes_known_wait_for_an_outcomes_partition_added_while_reading(
    reading: Reading, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="delayservice.level.marker_reader")
    reading.grow(reading.outcomes, 2)
    tp = (reading.outcomes, 1)
    reading.fake.append(tp, message(1, 0, reading.clock.ms(), topic=reading.outcomes))
    before = reading.gate.outcomes_through_ms
    reading.fake.paused_tps.add(tp)
    reading.one_pass()
    assert reading.gate.outcomes_through_ms == before, "answers known past one never read"
    assert reading.gate.through_ms > before  # the markers were all read: they move
    reading.fake.paused_tps.clear()
    reading.one_pass()
    assert reading.reader._read_to[tp] == 1
    assert reading.gate.outcomes_through_ms == reading.gate.through_ms
    (line,) = _grew(caplog)
    assert f"{reading.outcomes} grew from 1 to 2 partitions" in line


def test_a_markers_topic_made_again_is_read_from_its_start_and_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 46: the markers topic deleted and made again starts its offsets over. A
    pass that compared the new topic's ends with where the old one was read would move
    the gate past markers never read; the reader reads the new topic from its start."""
    reading = reading_rig(monkeypatch)
    reader, book, gate = reading.reader, reading.book, reading.gate
    reader._thread.is_alive = lambda: True  # type: ignore[method-assign]
    ids = {reading.markers: "m-1", reading.outcomes: "o-1"}
    reader._topic_ids = lambda names: {name: ids[name] for name in names}
    reader._ids.update(ids)  # as the reader saw them when it opened
    old = [cancel_on(reading, 0) for _ in range(5)]
    reading.one_pass()
    assert all(book.has(mid) for mid in old)
    through = gate.through_ms

    reading.fake.logs[(reading.markers, 0)] = []  # deleted, and made again
    ids[reading.markers] = "m-2"
    new = cancel_on(reading, 0)  # offset 0 of the new topic, below where the old was read
    with pytest.raises(marker_reader._RemadeError):
        reading.one_pass()
    assert gate.through_ms == through, "the gate moved past the new topic unread"
    ready, why = reader.health()
    assert not ready
    assert f"{reading.markers} was deleted and made again" in why
    reading.consumer = reader._open()  # as the reader's loop does
    reading.one_pass()
    assert book.has(new), "the cancel on the topic made again was never read"
    assert all(book.has(mid) for mid in old), "cancels acknowledged before were forgotten"
    assert gate.through_ms > through
    assert reader.health() == (True, "markers: read")
    told = [r.getMessage() for r in caplog.records if "made again while" in r.getMessage()]
    assert len(told) == 1
    assert reading.markers in told[0]
