"""`delayservice pending`: how many messages wait, per level and for precise mode, when
the next one is due and how overdue the oldest is.

Each figure comes from where it is true: what waits in Kafka from the broker (so it
answers with every daemon down), what a daemon holds in memory from its /metrics, and
what precise mode holds on disk from a census of the data directory on this host.
"""

from __future__ import annotations

import contextlib
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from delayservice.envelope import H_DELAY_MS, H_DUE_MS
from delayservice.kafka import client_config
from delayservice.level.layout import group_ids
from delayservice.levels import Level
from delayservice.precise.precise_worker import FAR_LEVEL_NAME, LEVEL_NAME, precise_group_id
from delayservice.precise.storage.cancel_log import pending_cancels
from delayservice.precise.storage.census import Census, take_census
from delayservice.precise.storage.data_dir import cancel_log_path
from delayservice.settings import Settings
from delayservice.status.kafka_backlog import Head, PartitionBacklog, backlog

log = logging.getLogger(__name__)

METRICS_TIMEOUT_S = 3.0
HELD_METRIC = "delayservice_buffered_messages"


@dataclass
class PendingRow:
    """One level, or a precise topic (`level` "exact", or "exact-far" for the far one)."""

    level: str
    topic: str
    in_kafka: int
    """Levels: records no instance has committed past (held ones included). Precise:
    records the intake has not yet written to disk."""
    held: int | None
    """Levels: of `in_kafka`, how many the daemons that answered hold in memory. Precise:
    owner copies on this host's disk. None: not known here."""
    next_due_ms: int | None
    """The earliest due time among what is known to wait; in the past when overdue."""
    by_due: dict[str, int] | None = None  # precise: owner copies on disk, by due class
    replica_copies: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def waiting(self) -> int:
        """Every message not yet delivered that this report can see."""
        if self.level in (LEVEL_NAME, FAR_LEVEL_NAME):
            return self.in_kafka + (self.held or 0)
        return self.in_kafka

    def overdue_s(self, now_ms: int) -> float:
        """How long the oldest waiting message is past its due time (0: none is)."""
        if self.next_due_ms is None or self.next_due_ms >= now_ms:
            return 0.0
        return (now_ms - self.next_due_ms) / 1000

    def as_json(self, now_ms: int) -> dict[str, Any]:
        return {
            "level": self.level,
            "topic": self.topic,
            "waiting": self.waiting,
            "in_kafka": self.in_kafka,
            "held": self.held,
            "next_due_ms": self.next_due_ms,
            "oldest_overdue_s": self.overdue_s(now_ms),
            "by_due": self.by_due,
            "replica_copies": self.replica_copies,
            "notes": self.notes,
        }


def level_due_ms(level: Level, head: Head) -> int:
    """When a level record is due: its append time plus the level's delay, or the
    envelope's own delay when that is longer (the daemon holds it that long)."""
    delay = level.delay_ms
    with contextlib.suppress(ValueError):  # a bad envelope is dead-lettered when read
        delay = max(delay, int(head.headers.get(H_DELAY_MS, b"0")))
    return head.timestamp_ms + delay


def precise_due_ms(head: Head) -> int | None:
    """When a precise record is due, as the intake fixes it (None: no envelope)."""
    try:
        due = head.timestamp_ms + int(head.headers[H_DELAY_MS])
        if H_DUE_MS in head.headers:
            due = max(due, int(head.headers[H_DUE_MS]))
    except (KeyError, ValueError):
        return None
    return due


def held_in_memory(urls: Iterable[str]) -> tuple[dict[str, float], list[str]]:
    """Per level, records the daemons at `urls` hold in memory; and the urls that did
    not answer."""
    held: dict[str, float] = {}
    silent: list[str] = []
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT_S) as response:  # noqa: S310
                text = response.read().decode()
        except (OSError, urllib.error.URLError) as exc:
            log.debug("no metrics at %s: %s", url, exc)
            silent.append(url)
            continue
        for family in text_string_to_metric_families(text):
            if family.name != HELD_METRIC:
                continue
            for sample in family.samples:
                level = sample.labels.get("level", "")
                held[level] = held.get(level, 0.0) + sample.value
    return held, silent


def _earliest(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def level_rows(settings: Settings, metrics_urls: list[str]) -> list[PendingRow]:
    client = client_config.common(settings)
    held, silent = held_in_memory(metrics_urls) if metrics_urls else ({}, [])
    rows = []
    for level in settings.level_set():
        parts = backlog(client, group_ids(settings, level), level.topic)
        row = PendingRow(
            level.name,
            level.topic,
            in_kafka=sum(p.waiting for p in parts),
            held=int(held[level.name]) if level.name in held else None,
            next_due_ms=_earliest(level_due_ms(level, p.head) for p in parts if p.head),
        )
        if silent and row.held is None:
            row.notes.append(f"no daemon answered at {', '.join(silent)}")
        rows.append(row)
    return rows


def precise_row(
    settings: Settings,
    now_ms: int,
    data_dir: Path | None,
    on_file: Callable[[int], None] | None = None,
    *,
    far: bool = False,
) -> PendingRow:
    """A precise topic (the far one with `far`): the intake's backlog in Kafka, per
    owner member's group, and a census of its data directory when that is on this host
    (each message once, by the copy the daemon would send)."""
    client = client_config.common(settings)
    topic = settings.precise_far_topic if far else settings.precise_topic
    parts: list[PartitionBacklog] = []
    members = settings.precise_members
    for member in range(members):  # each partition's owner commits its intake

        def owned(partition: int, member: int = member) -> bool:
            return partition % members == member

        parts += backlog(client, precise_group_id(settings, member, far=far), topic, owned)
    row = PendingRow(
        FAR_LEVEL_NAME if far else LEVEL_NAME,
        topic,
        in_kafka=sum(p.waiting for p in parts),
        held=None,
        next_due_ms=_earliest(precise_due_ms(p.head) for p in parts if p.head),
    )
    root = (data_dir or settings.data_dir) / topic
    if root.is_dir():
        cancels = pending_cancels(cancel_log_path(root.parent, topic))
        census: Census = take_census(root, now_ms, cancels, on_file)
        row.held = census.owned
        row.by_due = census.owner
        row.replica_copies = census.replicas
        row.next_due_ms = _earliest([row.next_due_ms, census.earliest_due_ms])
    else:
        row.notes.append(
            f"{root} is not on this host: run on the daemon's host, or pass --data-dir"
        )
    if row.in_kafka:
        row.notes.append(f"{row.in_kafka} not yet taken in: their due times are not counted")
    return row
