"""The outcomes topic on the real broker: pinned like the other inputs, and optional.

A deployment from before reschedules has every delay topic but no outcomes topic. The
audit must still run, judge every message by its own due time, and say why in its
output; once the topic exists it reads it and says nothing. The topics are empty, so
the job runs on the tests' Spark session without the Kafka connector.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from delayservice.audit import job
from delayservice.audit.extract import (
    CLOCK_SKEW_MS,
    NO_OUTCOMES,
    Window,
    pin_outcomes,
    read_outcomes,
)
from delayservice.audit.isolation import DEFAULT

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def _older_deployment(testbed, tmp_path):
    settings = testbed.settings(
        partitions=1, precise=True, precise_topic=f"dp-{testbed.tag}", data_dir=tmp_path / "data"
    )
    for topic in [level.topic for level in settings.level_set()] + [settings.precise_topic]:
        testbed.create_topic(topic, partitions=1)
    return settings


@pytest.mark.long  # a Spark audit of its own; CI's audit_e2e reads the outcomes topic
def test_an_audit_without_the_outcomes_topic_runs_and_says_so(testbed, spark, tmp_path):
    settings = _older_deployment(testbed, tmp_path)
    lines: list[str] = []

    older = job.audit(spark, settings, job.AuditOptions(out_dir=tmp_path / "older"), lines.append)
    assert older.ok
    assert older.note is not None
    assert settings.precise_outcomes_topic in older.note
    assert "judged by its own due time" in older.note
    assert older.document["reschedules"] == {
        "outcomes_topics": [],
        "messages_moved": 0,
        "note": older.note,
    }
    assert any(settings.precise_outcomes_topic in line for line in lines)

    testbed.create_topic(settings.precise_outcomes_topic, partitions=1)
    testbed.create_topic(settings.markers_outcomes_topic, partitions=1)
    current = job.audit(spark, settings, job.AuditOptions(out_dir=tmp_path / "now"), lines.append)
    assert current.note is None
    assert current.document["reschedules"]["outcomes_topics"] == sorted(
        [settings.markers_outcomes_topic, settings.precise_outcomes_topic]
    )


def test_the_outcomes_range_starts_before_since_and_ends_at_the_topics_end(testbed, tmp_path):
    settings = _older_deployment(testbed, tmp_path)
    topic = testbed.create_topic(settings.precise_outcomes_topic, partitions=1)
    producer = Producer({"bootstrap.servers": testbed.bootstrap})
    since = int(time.time() * 1000) - 3_600_000
    # Reply timestamps come from the daemon host's clock: one just inside the skew
    # allowance, one before it, one after --since.
    for offset_ms in (-CLOCK_SKEW_MS - 1000, -CLOCK_SKEW_MS + 1000, 5000):
        producer.produce(topic, b"{}", b"dp:0:1", timestamp=since + offset_ms)
    assert producer.flush(10) == 0

    assert pin_outcomes(settings, [topic], since - CLOCK_SKEW_MS, DEFAULT) == {topic: {0: (1, 3)}}
    assert pin_outcomes(settings, [topic], None, DEFAULT) == {topic: {0: (0, 3)}}
    absent = f"{topic}-absent"
    assert pin_outcomes(settings, [topic, absent], None, DEFAULT) == {topic: {0: (0, 3)}}


def test_precise_mode_off_reads_only_the_level_markers_outcomes_topic(testbed, spark):
    """Level cancels and moves are answered in every mode; the precise outcomes topic is
    asked for only with precise mode on."""
    settings = testbed.settings(partitions=1, precise=False)
    lines: list[str] = []
    outcomes = read_outcomes(
        spark, settings, Window(), kafka_options={}, progress=lines.append, isolation=DEFAULT
    )
    assert (outcomes.ranges, outcomes.absent) == ({}, [settings.markers_outcomes_topic])
    assert lines == [
        f"outcomes topic {settings.markers_outcomes_topic} does not exist: {NO_OUTCOMES}"
    ]
    assert outcomes.records.count() == 0
