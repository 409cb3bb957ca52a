"""A partition taken over while a killed member's transaction holds its offsets.

The previous owner committed offset 5, then sent offset 8 to a transaction and died by
SIGKILL. Until the broker aborts that transaction the committed offset is unstable. The
daemon that takes the partitions over meets a rebalance while it waits (a second
instance joins). It must start at 5, the offset that committed: not at 8 (that
transaction never committed, so records 5 to 7 would be lost) and not at the beginning
(records 0 to 4 would be forwarded twice). librdkafka's own fetch on assignment started
such a partition from the beginning under group churn.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from delayservice.envelope import Envelope, wrap
from delayservice.level.layout import level_group_id
from tests.faults.harness import Reader

pytestmark = pytest.mark.kafka

PARTITIONS = 2
RECORDS = 10
COMMITTED = 5
PENDING = 8
TRANSACTION_TIMEOUT_MS = 5_000


def _members(testbed, group: str) -> int:
    (future,) = testbed.admin.describe_consumer_groups([group]).values()
    return len(future.result(10).members)


def _committed(testbed, group: str, topic: str) -> list[int]:
    consumer = Consumer(
        {
            "bootstrap.servers": testbed.bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
        }
    )
    try:
        asked = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        return [tp.offset for tp in consumer.committed(asked, timeout=10)]
    except KafkaException:  # still unstable
        return []
    finally:
        consumer.close()


def test_a_new_owner_starts_at_the_committed_offset_while_a_dead_transaction_holds_it(
    testbed,
):
    settings = testbed.settings(levels="1s", partitions=PARTITIONS, guarantee="exactly-once")
    testbed.create_delay_topics(settings)
    (level,) = list(settings.level_set())
    target = testbed.create_topic(f"target-{testbed.tag}", partitions=1)
    group = level_group_id(settings, level)

    producer = Producer({"bootstrap.servers": testbed.bootstrap})
    ids = {}
    for partition in range(PARTITIONS):
        for offset in range(RECORDS):
            ids[(partition, offset)] = message_id = f"{partition}-{offset}-{uuid.uuid4().hex}"
            envelope = Envelope(target, 1000, message_id)
            producer.produce(level.topic, b"v", headers=wrap(envelope, None), partition=partition)
    assert producer.flush(30) == 0

    committer = Consumer({"bootstrap.servers": testbed.bootstrap, "group.id": group})
    committed = [TopicPartition(level.topic, p, COMMITTED) for p in range(PARTITIONS)]
    committer.commit(offsets=committed, asynchronous=False)
    committer.close()
    dead = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.faults.dead_transaction",
            testbed.bootstrap,
            group,
            level.topic,
            str(PENDING),
            str(TRANSACTION_TIMEOUT_MS),
            *map(str, range(PARTITIONS)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "pending" in dead.stdout, dead.stderr

    first = testbed.start_daemon(settings)
    # Once it has joined, its assignment meets the unstable offsets: a rebalance then.
    testbed.wait_for(lambda: _members(testbed, group) >= 1, 60, "the first member to join")
    second = testbed.start_daemon(settings)
    wanted = {ids[(p, o)] for p in range(PARTITIONS) for o in range(COMMITTED, RECORDS)}
    reader = Reader(testbed.bootstrap, [target])

    def delivered() -> list[str]:
        reader.catch_up(10)
        return [(r.header("delay-id") or b"").decode() for r in reader.records[target]]

    testbed.wait_for(lambda: wanted <= set(delivered()), 90, "records 5-9 of each partition")
    testbed.wait_for(lambda: first.readiness()[0] and second.readiness()[0], 60, "both ready")
    # Everything committed: nothing more will be forwarded, twice or otherwise.
    testbed.wait_for(
        lambda: _committed(testbed, group, level.topic) == [RECORDS] * PARTITIONS,
        60,
        "the last commit",
    )
    seen = delivered()
    reader.close()
    early = [i for i in seen if i not in wanted]
    assert early == [], f"records before the committed offset forwarded again: {early}"
    assert len(seen) == len(set(seen)) == len(wanted)
