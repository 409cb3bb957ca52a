"""Partitions as the level worker keys them, and as its log lines name them: the
consumer thread's pieces share both, so they live below all of them."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import TopicPartition

from delayservice.forward.buffer import TP


def tp_of(tp: TopicPartition) -> TP:
    return (tp.topic, tp.partition)


def named(tps: Iterable[TP]) -> str:
    """Partitions as `topic[0,2]`, for log lines."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in tps:
        by_topic.setdefault(topic, []).append(partition)
    return (
        ", ".join(f"{topic}{sorted(partitions)}" for topic, partitions in sorted(by_topic.items()))
        or "[]"
    )
