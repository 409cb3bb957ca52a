"""How a process splits its levels into workers, and the Kafka ids each worker uses.

`level_workers = "shared"` (the default) runs one worker for every level of the
process: one consumer group, one transactional id and one static member name per
instance, as Kafka Streams' `StreamThread` runs every task it owns. `"per-level"` is
the seeds' layout, one worker per level, with the ids every earlier version used
(`{group_id}-{level topic}` and so on), so a cluster that runs it keeps its offsets
and dashboards.

The two layouts commit offsets in different groups. A worker starts each partition it
is assigned at the later of its own group's committed offset and the other layout's
(`OtherLayout`): after a change of layout the other group is the one that moved on
(and on the way back, this one's offsets are the old ones), and it waits while that
group's offsets are unstable (a killed member's open transaction holds them), so a
change of layout neither skips nor repeats.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import Consumer, KafkaException, TopicPartition

from delayservice.forward.buffer import TP
from delayservice.kafka import client_config
from delayservice.levels import Level
from delayservice.settings import Settings

log = logging.getLogger(__name__)

SHARED: Final = "shared"
PER_LEVEL: Final = "per-level"
SHARED_NAME: Final = "levels"
"""The shared worker's name: its metrics' `worker` label, its ids' suffix."""
ADMIN_TIMEOUT_S: Final = 5.0
"""Normally milliseconds; a broker just restarted may not answer at once (asked again)."""


@dataclass(frozen=True)
class WorkerPlan:
    """One worker: its name, its levels and its Kafka ids."""

    name: str
    levels: tuple[Level, ...]
    group_id: str
    transactional_id: str
    member_id: str


def _ids(settings: Settings, suffix: str) -> tuple[str, str, str]:
    return (
        f"{settings.group_id}-{suffix}",
        f"{settings.group_id}-{settings.instance_name}-{suffix}",
        f"{settings.instance_name}-{suffix}",
    )


def workers(settings: Settings, layout: str | None = None) -> list[WorkerPlan]:
    """The level workers of a process under `layout` (the settings' by default)."""
    layout = layout if layout is not None else settings.level_workers
    levels = list(settings.level_set())
    if layout == PER_LEVEL:
        return [WorkerPlan(lv.name, (lv,), *_ids(settings, lv.topic)) for lv in levels]
    return [WorkerPlan(SHARED_NAME, tuple(levels), *_ids(settings, SHARED_NAME))]


def group_ids(settings: Settings, level: Level) -> list[str]:
    """The consumer groups whose commits say how far `level` was forwarded: this
    layout's first, then the other's (where a changed layout's progress still is)."""
    other = PER_LEVEL if settings.level_workers == SHARED else SHARED
    return [
        plan.group_id
        for layout in (settings.level_workers, other)
        for plan in workers(settings, layout)
        if level in plan.levels
    ]


def level_group_id(settings: Settings, level: Level) -> str:
    """The consumer group that forwards `level` under the settings' layout."""
    return group_ids(settings, level)[0]


class OtherLayout:
    """Committed offsets of the other layout's groups (`ConsumerLoop` `fallback`). Asked
    with `require_stable`, so an open transaction of the other layout's last run makes
    it wait, not guess."""

    def __init__(self, settings: Settings, levels: tuple[Level, ...]) -> None:
        other = PER_LEVEL if settings.level_workers == SHARED else SHARED
        self._groups: dict[str, str] = {}
        """level topic -> the other layout's group for it."""
        for plan in workers(settings, other):
            for level in plan.levels:
                if level in levels:
                    self._groups[level.topic] = plan.group_id
        self._settings = settings

    def __call__(self, tps: list[TP]) -> dict[TP, int] | None:
        """The other group's committed offset of each of `tps` that has one; None while
        any of them is unstable or the broker does not answer (asked again by the
        caller). A client of its own each time: it runs at assignments only, and one
        kept across a broker restart was seen to time out for a minute after it.

        A consumer of the other group that never joins it asks, not the admin API's
        `list_consumer_group_offsets`: that one looks up the coordinator the way that
        can abort the process when a connection drops (`kafka.group_members`). Its
        `read_committed` makes the fetch require stable offsets, and librdkafka asks
        again while they are unstable, so an open transaction of the other layout's
        last run makes this wait, not guess."""
        by_group: dict[str, list[TopicPartition]] = {}
        for topic, partition in tps:
            group = self._groups.get(topic)
            if group is not None:
                by_group.setdefault(group, []).append(TopicPartition(topic, partition))
        client_id = f"delayservice-{self._settings.instance_name}-layout-offsets"
        settings = self._settings
        consumers: dict[str, Any] = {}
        try:
            # All made before any is asked, so each finds its coordinator meanwhile: for
            # 12 groups ~140 ms, against ~700 ms made and asked one after another.
            for group in by_group:
                consumers[group] = Consumer(client_config.consumer(settings, group, client_id))
            return _committed(consumers, by_group)
        finally:
            for consumer in consumers.values():
                consumer.close()


def _committed(
    consumers: dict[str, Any], by_group: dict[str, list[TopicPartition]]
) -> dict[TP, int] | None:
    found: dict[TP, int] = {}
    for group, asked in by_group.items():
        try:
            answer = consumers[group].committed(asked, timeout=ADMIN_TIMEOUT_S)
        except KafkaException as exc:  # a broker away or restarting, offsets unstable
            log.info("offsets of %s not given yet (%r); asking again", group, exc)
            return None
        for tp in answer:
            if tp.error is not None:
                log.info("offsets of %s not given yet (%s); asking again", group, tp.error)
                return None
            if tp.offset >= 0:
                found[(tp.topic, tp.partition)] = tp.offset
    return found
