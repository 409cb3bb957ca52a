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
