"""A level markers reader on fakes, driven one pass at a time from the test's own thread:
its reading consumer, which knows of the partitions it listed itself (librdkafka's
metadata cache), and the second one it lists the topics and asks their ends with, both
over one fake broker's logs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME
from prometheus_client import CollectorRegistry

from delayservice.envelope import H_CANCEL
from delayservice.level.markers import reader as marker_reader
from delayservice.level.markers.book import MarkerBook
from delayservice.level.markers.gate import MarkerGate
from delayservice.level.markers.reader import MarkerReader
from delayservice.markers.level_ids import level_id
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.settings_loading import load_settings
from tests.level.fakes import FakeClock, FakeConsumer, message


@dataclass
class Reading:
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


def reading_rig(
    monkeypatch: pytest.MonkeyPatch, markers_partitions: int = 1, first_pass: bool = True
) -> Reading:
    """`first_pass`: read once before it is handed over (the gate open)."""
    monkeypatch.setattr(marker_reader, "PASS_TIMEOUT_S", 0.3)  # a pass that cannot finish
    settings = load_settings(levels="1s,5s", bootstrap_servers="127.0.0.1:9")
    levels = settings.level_set()
    clock = FakeClock()
    fake = FakeConsumer(settings.markers_topic, settings.markers_outcomes_topic)
    fake.blocking = False
    fake.partition_counts = {
        settings.markers_topic: markers_partitions,
        settings.markers_outcomes_topic: 1,
        **{level.topic: 3 for level in levels},
    }
    fake.metadata_seen = {}
    lister = FakeConsumer(settings.markers_topic, settings.markers_outcomes_topic)
    lister.partition_counts = fake.partition_counts  # the same broker
    lister.logs = fake.logs

    def make_consumer(config: dict[str, Any]) -> FakeConsumer:
        return lister if "lister" in config["client.id"] else fake

    book, gate = MarkerBook(levels), MarkerGate(100)
    reader = MarkerReader(
        settings, book, gate, ServiceMetrics(CollectorRegistry()), clock.ms, make_consumer
    )
    consumer = reader._open()
    made = Reading(
        clock,
        fake,
        book,
        gate,
        reader,
        consumer,
        settings.markers_topic,
        settings.markers_outcomes_topic,
    )
    if first_pass:
        made.one_pass()
        assert gate.through_ms == clock.ms()
    return made


def cancel_on(reading: Reading, partition: int, names: int = 0) -> str:
    """A cancel appended on the markers topic's `partition`, of a message of the first
    level's partition `names`."""
    mid = level_id(1, names, reading.clock.ms())
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
