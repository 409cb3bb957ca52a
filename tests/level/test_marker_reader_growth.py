"""Partitions added to the markers topic or its outcomes topic while the reader runs
(an operator grew the topic; the SDK then spreads markers over every partition it
has): the reader assigns them from their beginning, and the gate does not move past a
pass's time until they were read to their end as of that pass. It says so once, at
WARNING. The reader runs on the test's own thread, one pass at a time, over fakes: its
reading consumer, which knows of the partitions it listed itself (librdkafka's metadata
cache), and the second one it lists the topics with."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME
from prometheus_client import CollectorRegistry

from delayservice.envelope import H_CANCEL
from delayservice.level import marker_reader
from delayservice.level.ids import level_id
from delayservice.level.marker_book import MarkerBook
from delayservice.level.marker_gate import MarkerGate
from delayservice.level.marker_reader import MarkerReader
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.settings import load_settings
from tests.level.fakes import FakeClock, FakeConsumer, message


@dataclass
class _Reading:
    clock: FakeClock
    fake: FakeConsumer
    book: MarkerBook
    gate: MarkerGate
    reader: MarkerReader
    consumer: Any
    markers: str
    outcomes: str

    def grow(self, topic: str, count: int) -> None:
        self.fake.partition_counts[topic] = count

    def one_pass(self) -> None:
        self.clock.advance(0.2)
        self.reader._pass(self.consumer)


@pytest.fixture
def reading(monkeypatch: pytest.MonkeyPatch) -> _Reading:
    monkeypatch.setattr(marker_reader, "PASS_TIMEOUT_S", 0.3)  # a pass that cannot finish
    settings = load_settings(levels="1s,5s", bootstrap_servers="127.0.0.1:9")
    levels = settings.level_set()
    clock = FakeClock()
    fake = FakeConsumer(settings.markers_topic, settings.markers_outcomes_topic)
    fake.blocking = False
    fake.partition_counts = {
        settings.markers_topic: 1,
        settings.markers_outcomes_topic: 1,
        **{level.topic: 3 for level in levels},
    }
    fake.metadata_seen = {}
    lister = FakeConsumer(settings.markers_topic, settings.markers_outcomes_topic)
    lister.partition_counts = fake.partition_counts  # the same broker

    def make_consumer(config: dict[str, Any]) -> FakeConsumer:
        return lister if "lister" in config["client.id"] else fake

    book, gate = MarkerBook(levels), MarkerGate(100)
    reader = MarkerReader(
        settings, book, gate, ServiceMetrics(CollectorRegistry()), clock.ms, make_consumer
    )
    consumer = reader._open()
    made = _Reading(
        clock,
        fake,
        book,
        gate,
        reader,
        consumer,
        settings.markers_topic,
        settings.markers_outcomes_topic,
    )
    made.one_pass()
    assert gate.through_ms == clock.ms()
    return made


def _cancel(reading: _Reading, partition: int) -> str:
    mid = level_id(1, 0, reading.clock.ms())
    tp = (reading.markers, partition)
    record = message(
        partition,
        reading.fake.next_offset(tp),
        reading.clock.ms(),
        topic=reading.markers,
        headers=[(H_CANCEL, mid.encode())],
        timestamp_type=TIMESTAMP_CREATE_TIME,
    )
    reading.fake.append(tp, record)
    return mid


def _grew(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "grew" in r.getMessage()
    ]


def test_a_marker_on_a_partition_added_while_reading_is_read_before_the_gate_passes_it(
    reading: _Reading, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="delayservice.level.marker_reader")
    reading.grow(reading.markers, 4)
    mid = _cancel(reading, 3)
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
    later = _cancel(reading, 2)
    reading.one_pass()
    assert reading.book.has(later)
    (line,) = _grew(caplog)
    assert f"{reading.markers} grew from 1 to 4 partitions" in line


def test_the_outcomes_known_wait_for_an_outcomes_partition_added_while_reading(
    reading: _Reading, caplog: pytest.LogCaptureFixture
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
