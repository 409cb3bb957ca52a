"""Bad input never blocks: each kind reaches the dead-letter topic while good records flow."""

from __future__ import annotations

import os

import pytest
from confluent_kafka import Producer

pytestmark = pytest.mark.kafka


def test_each_bad_input_kind_is_dead_lettered_and_good_messages_keep_flowing(testbed):
    settings = testbed.settings(levels="1s")
    testbed.create_delay_topics(settings)
    level_topic = settings.level_set().levels[0].topic
    target = testbed.create_topic(f"good-{testbed.tag}", partitions=2)
    small = testbed.create_topic(
        f"small-{testbed.tag}", partitions=1, config={"max.message.bytes": "2048"}
    )
    daemon = testbed.start_daemon(settings)
    testbed.wait_assigned(daemon, partitions=settings.partitions)

    good = testbed.producer(settings)
    raw = Producer({"bootstrap.servers": testbed.bootstrap})
    envelope = [("delay-v", b"1"), ("delay-ms", b"1000"), ("delay-id", b"bad")]
    bad = {
        "no-envelope": ([("trace", b"1")], "invalid_envelope"),
        "bad-version": (
            [("delay-v", b"9"), *envelope[1:], ("delay-target", target.encode())],
            "invalid_envelope",
        ),
        "unknown-topic": (
            [*envelope, ("delay-target", f"nope-{testbed.tag}".encode())],
            "unknown_topic",
        ),
        "bad-partition": (
            [*envelope, ("delay-target", target.encode()), ("delay-partition", b"9")],
            "unknown_partition",
        ),
    }
    ids = []
    for i in range(60):
        ids.append(good.produce(target, f"good-{i}".encode(), key=str(i).encode(), delay=1))
        if i % 15 == 0:
            for name, (headers, _reason) in bad.items():
                raw.produce(level_topic, name.encode(), key=name.encode(), headers=headers)
    big = os.urandom(8192)  # incompressible: lz4 must not shrink it under the limit
    too_large_id = good.produce(small, big, key=b"too-large", delay=1)
    assert good.flush(10) == 0
    assert raw.flush(10) == 0

    delivered = testbed.collect(target, len(ids), timeout=30)
    assert {dict(r.headers())["delay-id"].decode() for r in delivered} == set(ids)

    expected = {name: reason for name, (_h, reason) in bad.items()}
    expected["too-large"] = "too_large"
    dead = testbed.collect(settings.dead_letter_topic, 4 * 4 + 1, timeout=30)
    reasons = {}
    for record in dead:
        headers = dict(record.headers())
        reasons.setdefault(record.key().decode(), set()).add(headers["dlq-reason"].decode())
        assert headers["dlq-origin-topic"].decode() == level_topic
        assert int(headers["dlq-origin-offset"]) >= 0
        assert headers["dlq-detail"]
        if record.key() == b"too-large":
            assert headers["delay-id"].decode() == too_large_id
            assert record.value() == big
    assert reasons == {name: {reason} for name, reason in expected.items()}

    # Counted per reason, and every offset committed: nothing is left buffered.
    worker = daemon.workers[0]
    testbed.wait_for(lambda: worker.group.total_buffered == 0, 15, "the level to settle")
    metric = daemon.registry.get_sample_value
    for reason, count in {
        "invalid_envelope": 8,
        "unknown_topic": 4,
        "unknown_partition": 4,
        "too_large": 1,
    }.items():
        assert (
            metric("delayservice_dead_lettered_total", {"level": "1s", "reason": reason}) == count
        )
    testbed.wait_for(lambda: worker.loop.uncommitted() == {}, 10, "safe offsets to be committed")
