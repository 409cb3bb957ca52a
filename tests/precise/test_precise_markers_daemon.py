"""`delayservice reschedule` and `cancel` against a real daemon: each says what the
daemon did, and the message goes out once, at the time the last move gave it."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_commands import _cli
from tests.precise.test_precise_daemon import _exact_producer, _headers, _precise

pytestmark = pytest.mark.kafka


def _env(settings: Any) -> dict[str, str]:
    return {
        "DELAYSERVICE_PRECISE": "true",
        "DELAYSERVICE_PRECISE_TOPIC": settings.precise_topic,
        "DELAYSERVICE_LEVELS": settings.levels,
        "DELAYSERVICE_TOPIC_PREFIX": settings.topic_prefix,
        "DELAYSERVICE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
    }


def _reply(result: Any) -> str:
    """The reply line of a marker command (its last line, stdout or stderr)."""
    return (result.stdout + result.stderr).strip().splitlines()[-1]


def _records_in(testbed: Any, topic: str) -> int:
    """Every record the topic holds, from its end offsets."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": testbed.bootstrap, "group.id": topic})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        )
    finally:
        consumer.close()


@pytest.mark.parametrize(
    "guarantee", [pytest.param("at-least-once", marks=pytest.mark.long), "exactly-once"]
)
def test_reschedule_and_cancel_say_what_the_daemon_did(testbed, tmp_path: Path, guarantee: str):
    """Exactly-once, the replies commit in the forwarder's transactions."""
    settings = _precise(testbed, tmp_path, guarantee=guarantee)
    target = testbed.create_topic(f"moved-{testbed.tag}")
    daemon = testbed.start_daemon(settings)
    testbed.wait_assigned(daemon, partitions=settings.partitions)
    producer = _exact_producer(testbed, settings)
    moved = producer.produce(target, b"moved", delay=60)
    sent_at = time.time()
    # Far enough ahead that the CLI calls before its cancel still find it unsent on a
    # loaded host (8 s was not, at load average 9).
    doomed = producer.produce(target, b"cancelled", delay=25)
    assert producer.flush(10) == 0
    env = _env(settings)

    asked_at = time.time()
    result = _cli("reschedule", moved, "--delay", "3s", env=env)
    assert result.returncode == 0, result.stderr
    assert re.search(r": moved by member 0 \(owner\): due \S+ \S+Z \(in ", _reply(result))
    assert _cli("cancel", doomed, env=env).returncode == 0
    cancelled = _cli("reschedule", doomed, "--delay", "1s", env=env)
    assert cancelled.returncode == 1
    assert "cancelled by member 0 (owner): a cancel came first" in _reply(cancelled)
    unknown = _cli("reschedule", "0123456789abcdef0123456789abcdef-p0", "-d", "1s", env=env)
    assert unknown.returncode == 1
    assert ": unmatched by member 0 (owner)" in _reply(unknown)

    (record,) = testbed.collect(target, 1, timeout=30)
    headers = _headers(record)
    assert headers["delay-id"].decode() == moved
    due_ms = int(headers["delay-due-ms"])
    assert asked_at * 1000 + 3000 <= due_ms <= time.time() * 1000
    assert record.timestamp()[1] >= due_ms
    assert record.value() == b"moved"

    late = _cli("reschedule", moved, "--delay", "30s", env=env)
    assert late.returncode == 1
    assert ": too_late by member 0 (owner): the message was already sent" in _reply(late)
    time.sleep(max(0.0, sent_at + 25 + 1 - time.time()))  # past the cancelled one's due
    assert len(testbed.collect(target, 1, timeout=10)) == 1  # read_committed, to the end
    sample = daemon.registry.get_sample_value
    counts = {
        outcome: sample("delayservice_precise_reschedules_total", {"outcome": outcome})
        for outcome in ("moved", "cancelled", "unmatched", "too_late")
    }
    assert counts == dict.fromkeys(counts, 1.0)


def test_far_messages_are_held_by_the_far_wheel_and_move_and_cancel_like_near_ones(
    testbed, tmp_path: Path
):
    """Beyond `precise_far_after` the producer sends to the far topic, whose own wheel
    holds the message; its markers follow it there, and a move brings it back on time."""
    from delayservice.markers.precise_ids import named_place

    settings = _precise(testbed, tmp_path, precise_far_after="30s")
    target = testbed.create_topic(f"farmove-{testbed.tag}")
    daemon = testbed.start_daemon(settings)
    testbed.wait_assigned(daemon, partitions=settings.partitions)
    producer = _exact_producer(testbed, settings)
    pulled_in = producer.produce(target, b"pulled in", delay=3600)
    cancelled = producer.produce(target, b"cancelled", delay=3600)
    sent_at = time.time()
    # Near (under precise_far_after), and far enough ahead that two CLI calls on a loaded
    # host still find it unsent.
    pushed_out = producer.produce(target, b"pushed out", delay=25)
    assert producer.flush(10) == 0
    assert [named_place(m).far for m in (pulled_in, cancelled, pushed_out)] == [  # type: ignore[union-attr]
        True,
        True,
        False,
    ]
    env = _env(settings)
    asked_at = time.time()
    moved = _cli("reschedule", pulled_in, "--delay", "2s", env=env)
    assert moved.returncode == 0, moved.stderr
    assert ": moved by member 0 (owner)" in _reply(moved)
    assert _cli("reschedule", pushed_out, "--delay", "1h", env=env).returncode == 0
    assert _cli("cancel", cancelled, env=env).returncode == 0
    (record,) = testbed.collect(target, 1, timeout=30)
    assert _headers(record)["delay-id"].decode() == pulled_in
    assert record.timestamp()[1] >= int(_headers(record)["delay-due-ms"]) >= asked_at * 1000 + 2000
    time.sleep(max(0.0, sent_at + 27 - time.time()))  # past the pushed-out one's old time
    assert _records_in(testbed, target) == 1
    far = settings.data_dir / settings.precise_far_topic
    assert far.is_dir()
    assert f"{settings.precise_far_topic}.cancels.log" in {p.name for p in tmp_path.rglob("*.log")}
