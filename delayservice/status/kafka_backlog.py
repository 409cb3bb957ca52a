"""What waits in Kafka: per partition, the records after a group's committed offset,
and the first of them.

Read from the broker alone, so it answers while every daemon is down, which is when an
operator most needs to know whether anything is overdue. The group is never joined:
committed offsets are fetched by id, and heads are read with `assign`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaException, TopicPartition

from delayservice.errors import DelayServiceError
from delayservice.kafka.record_headers import header_values

TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Head:
    """The first waiting record of a partition: what its due time is computed from."""

    offset: int
    timestamp_type: int
    timestamp_ms: int
    headers: dict[str, bytes]


@dataclass(frozen=True)
class PartitionBacklog:
    partition: int
    waiting: int  # records at or after the committed offset
    committed: int | None  # None: the group never committed here
    head: Head | None  # the first waiting record (None when nothing waits)


def _status_consumer(client: dict[str, Any], group_id: str) -> Any:
    return Consumer(
        {
            **client,
            "group.id": group_id,
            "client.id": f"delayservice-status-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )


def backlog(
    client: dict[str, Any],
    group_ids: str | Sequence[str],
    topic: str,
    keep: Callable[[int], bool] | None = None,
) -> list[PartitionBacklog]:
    """Per partition of `topic` (those `keep` accepts), what the groups have not
    committed past (the furthest of them: a level's progress is in the group of the
    worker layout that ran last, `level.layout.group_ids`), and its first record."""
    groups = [group_ids] if isinstance(group_ids, str) else list(group_ids)
    consumer = _status_consumer(client, groups[0])
    try:
        return _backlog(consumer, topic, keep, [_status_consumer(client, g) for g in groups[1:]])
    except KafkaException as exc:
        raise DelayServiceError(f"reading the backlog of {topic}: {exc}") from exc
    finally:
        consumer.close()


def _backlog(
    consumer: Any, topic: str, keep: Callable[[int], bool] | None, others: list[Any]
) -> list[PartitionBacklog]:
    meta = consumer.list_topics(topic, timeout=TIMEOUT_S).topics.get(topic)
    if meta is None or meta.error is not None:
        reason = meta.error.str() if meta is not None and meta.error is not None else "missing"
        raise DelayServiceError(f"topic {topic}: {reason}")
    partitions = sorted(p for p in meta.partitions if keep is None or keep(p))
    tps = [TopicPartition(topic, p) for p in partitions]
    committed = {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=TIMEOUT_S)}
    for other in others:
        try:
            for tp in other.committed(tps, timeout=TIMEOUT_S):
                committed[tp.partition] = max(committed.get(tp.partition, -1), tp.offset)
        finally:
            other.close()
    starts: dict[int, int] = {}
    found: dict[int, PartitionBacklog] = {}
    for p in partitions:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, p), timeout=TIMEOUT_S, cached=False
        )
        done = committed.get(p, OFFSET_INVALID)
        start = max(low, done) if done >= 0 else low
        waiting = max(0, high - start)
        known = done if done >= 0 else None
        if waiting:
            starts[p] = start
        found[p] = PartitionBacklog(p, waiting, known, None)
    heads = _first_records(consumer, topic, starts)
    return [
        PartitionBacklog(b.partition, b.waiting, b.committed, heads.get(b.partition))
        for b in found.values()
    ]


def _first_records(consumer: Any, topic: str, starts: dict[int, int]) -> dict[int, Head]:
    """The first record at or after each start (read_committed: an aborted or control
    record is skipped by the client)."""
    if not starts:
        return {}
    consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
    heads: dict[int, Head] = {}
    left = set(starts)
    deadline = time.monotonic() + TIMEOUT_S
    while left and time.monotonic() < deadline:
        for message in consumer.consume(len(left), 0.5):
            partition = message.partition()
            if partition not in left:
                continue
            if message.error() is None:
                kind, stamp = message.timestamp()
                heads[partition] = Head(message.offset(), kind, stamp, header_values(message))
            left.discard(partition)  # a record, or the end (nothing committed waits)
    return heads
