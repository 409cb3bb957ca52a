"""Create and inspect the level topics and the dead-letter topic.

Level topics must use `message.timestamp.type=LogAppendTime`: the due time is the
broker's append time plus the level's delay, which is monotonic in offset order, so
each partition's head is its earliest-due record and producer clock skew cannot make
a record early. Retention must be well above the level's delay, or a paused backlog
could be deleted before it is forwarded.

Two for cancel and reschedule of level messages: the markers topic (as many partitions
as a level topic: a marker goes to its level partition's, so a flood of markers on one
holds back only that partition's records; LogAppendTime, since a marker counts if its
append time is before its message's due time; kept as long as a level topic, since a
restarted daemon reads it again for every message still waiting) and its outcomes
topic (one partition), where the daemon answers them.

With `precise` on, five more: the precise topic and the far topic (LogAppendTime too,
since due times count from their append time; their records wait in the daemon's
wheels, not in Kafka, so retention only has to cover an unread backlog), a done topic
for each, where owners report progress and which must be compacted, so the latest
report per key outlives retention, and the outcomes topic, where the daemon replies
to cancels and reschedules (deleted by age: a reply matters while its sender waits,
and to audits of the period).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from delayservice.errors import DelayServiceError
from delayservice.levels import format_duration_ms
from delayservice.settings import Settings

HOUR_MS = 3_600_000
LOG_APPEND_TIME = "LogAppendTime"
COMPACT = "compact"


def min_retention_ms(delay_ms: int) -> int:
    """Enough for a backlog to wait out the delay many times over: 10x, at least a day."""
    return max(24 * HOUR_MS, 10 * delay_ms)


@dataclass
class TopicSpec:
    name: str
    role: str
    partitions: int
    replication: int
    config: dict[str, str]
    min_retention_ms: int | None = None
    """Set for topics whose due times count from append time: needs LogAppendTime and
    at least this retention."""
    compacted: bool = False
    """The topic must keep the latest record per key: `cleanup.policy=compact` alone."""


@dataclass
class TopicStatus:
    spec: TopicSpec
    exists: bool
    partitions: int | None = None
    config: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def wanted(settings: Settings) -> list[TopicSpec]:
    base_retention = int(settings.retention_hours * HOUR_MS)
    specs = []
    for level in settings.level_set():
        retention = max(base_retention, min_retention_ms(level.delay_ms))
        specs.append(
            TopicSpec(
                level.topic,
                f"level {level.name}",
                settings.partitions,
                settings.replication_factor,
                {"message.timestamp.type": LOG_APPEND_TIME, "retention.ms": str(retention)},
                min_retention_ms(level.delay_ms),
            )
        )
    specs.append(
        TopicSpec(
            settings.dead_letter_topic,
            "dead letters",
            settings.partitions,
            settings.replication_factor,
            {"retention.ms": str(base_retention)},
        )
    )
    specs.extend(_marker_specs(settings, base_retention))
    if settings.precise:
        specs.extend(_precise_specs(settings, base_retention))
    return specs


def _marker_specs(settings: Settings, base_retention: int) -> list[TopicSpec]:
    """The markers topic partitioned like the levels (`level.markers.gate`); one partition for
    the outcomes topic, which a sender waiting for an answer reads from its end."""
    top = min_retention_ms(settings.level_set().max_delay_ms)
    return [
        TopicSpec(
            settings.markers_topic,
            "level markers",
            settings.partitions,
            settings.replication_factor,
            {
                "message.timestamp.type": LOG_APPEND_TIME,
                "retention.ms": str(max(base_retention, top)),
            },
            top,
        ),
        TopicSpec(
            settings.markers_outcomes_topic,
            "level outcomes",
            1,
            settings.replication_factor,
            {"retention.ms": str(base_retention)},
        ),
    ]


def _precise_specs(settings: Settings, base_retention: int) -> list[TopicSpec]:
    """One partition for the done topic: every member reads all of it (a replica needs
    the reports of its owner, whichever member that is), so more partitions would buy
    nothing, and one keeps all reports in one order. One for the outcomes topic too:
    a waiting sender reads it from its end, and it carries a record per marker."""
    specs = []
    for topic, done, role in (
        (settings.precise_topic, settings.precise_done_topic, "precise"),
        (settings.precise_far_topic, settings.precise_far_done_topic, "precise far"),
    ):
        specs.append(
            TopicSpec(
                topic,
                role,
                settings.partitions,
                settings.replication_factor,
                {
                    "message.timestamp.type": LOG_APPEND_TIME,
                    "retention.ms": str(max(base_retention, min_retention_ms(0))),
                },
                min_retention_ms(0),
            )
        )
        specs.append(
            TopicSpec(
                done,
                f"{role} done",
                1,
                settings.replication_factor,
                {"cleanup.policy": COMPACT},
                compacted=True,
            )
        )
    return [
        *specs,
        TopicSpec(
            settings.precise_outcomes_topic,
            "precise outcomes",
            1,
            settings.replication_factor,
            {"retention.ms": str(base_retention)},
        ),
    ]


def describe(admin: AdminClient, settings: Settings, timeout: float = 15.0) -> list[TopicStatus]:
    specs = wanted(settings)
    try:
        meta = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise DelayServiceError.from_kafka(exc.args[0], "listing topics") from exc
    statuses = []
    present = []
    for spec in specs:
        info = meta.topics.get(spec.name)
        if info is None or info.error is not None:
            statuses.append(TopicStatus(spec, False, problems=["missing"]))
            continue
        status = TopicStatus(spec, True, partitions=len(info.partitions))
        statuses.append(status)
        present.append(status)
    if present:
        resources = [ConfigResource(ConfigResource.Type.TOPIC, s.spec.name) for s in present]
        futures = admin.describe_configs(resources, request_timeout=timeout)
        for status, resource in zip(present, resources, strict=True):
            entries = futures[resource].result(timeout)
            status.config = {name: entry.value for name, entry in entries.items()}
            status.problems = _problems(status)
    return statuses


def _problems(status: TopicStatus) -> list[str]:
    spec, config = status.spec, status.config
    problems: list[str] = []
    if spec.compacted:
        policy = config.get("cleanup.policy")
        if policy != COMPACT:
            problems.append(
                f"cleanup.policy is {policy}, needs {COMPACT} "
                "(progress reports would be deleted by age)"
            )
    if spec.min_retention_ms is None:
        return problems
    ts_type = config.get("message.timestamp.type")
    if ts_type != LOG_APPEND_TIME:
        problems.append(
            f"message.timestamp.type is {ts_type}, needs {LOG_APPEND_TIME} "
            "(due times would follow producer clocks)"
        )
    retention = int(config.get("retention.ms", "-1"))
    if 0 <= retention < spec.min_retention_ms:
        problems.append(
            f"retention.ms is {format_duration_ms(retention)}, needs at least "
            f"{format_duration_ms(spec.min_retention_ms)}"
        )
    return problems


def create(
    admin: AdminClient, settings: Settings, timeout: float = 30.0
) -> list[tuple[TopicSpec, str]]:
    """Create what is missing; leave existing topics alone. Returns (spec, outcome) pairs."""
    specs = wanted(settings)
    new = [
        NewTopic(
            s.name, num_partitions=s.partitions, replication_factor=s.replication, config=s.config
        )
        for s in specs
    ]
    futures = admin.create_topics(new, request_timeout=timeout)
    outcomes: list[tuple[TopicSpec, str]] = []
    for spec in specs:
        try:
            futures[spec.name].result(timeout)
            outcomes.append((spec, "created"))
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                outcomes.append((spec, "exists"))
            else:
                raise DelayServiceError.from_kafka(error, f"creating {spec.name}") from exc
    created = [spec.name for spec, outcome in outcomes if outcome == "created"]
    listed(admin, created, timeout)
    return outcomes


LISTED_POLL_S = 0.1


def listed(admin: AdminClient, names: list[str], timeout: float) -> None:
    """Return once every topic of `names` is in the brokers' metadata with a leader for
    each partition. A topic reaches it a moment after the controller accepted it, and a
    client asking meanwhile is told it does not exist: a producer made right after
    `topics create` refused a cancel with "create it with topics create"."""
    deadline = time.monotonic() + timeout
    pending = set(names)
    why = ""
    while pending:
        try:
            found = admin.list_topics(timeout=max(0.5, deadline - time.monotonic())).topics
        except KafkaException as exc:  # made already: ask again until the deadline
            found, why = {}, f" (last: {exc.args[0].str() if exc.args else exc})"
        for name in sorted(pending):
            topic = found.get(name)
            if (
                topic is not None
                and topic.error is None
                and topic.partitions
                and all(p.leader >= 0 for p in topic.partitions.values())
            ):
                pending.discard(name)
        if pending and time.monotonic() >= deadline:
            raise DelayServiceError(
                f"created, but not in the brokers' metadata after {timeout:g}s: "
                + ", ".join(sorted(pending))
                + why,
                retriable=True,
            )
        if pending:
            time.sleep(LISTED_POLL_S)


def advice(statuses: list[TopicStatus], settings: Settings) -> list[str]:
    """What works but could be better: a markers topic with fewer partitions than a
    level topic puts the markers of several level partitions on one, so a flood of
    markers there holds back more records than its own."""
    markers = next((s for s in statuses if s.spec.name == settings.markers_topic), None)
    levels = {level.topic for level in settings.level_set()}
    widest = max((s.partitions or 0 for s in statuses if s.spec.name in levels), default=0)
    if markers is None or markers.partitions is None or markers.partitions >= widest:
        return []
    return [
        f"{markers.spec.name} has {markers.partitions} partition(s) and a level topic has "
        f"{widest}: markers of several level partitions share one, and a flood of markers "
        f"there holds back all their records; grow it to {widest} once every producer "
        "runs this version (docs/operations.md, 'Partitions of the markers topic')"
    ]


def problems_summary(statuses: list[TopicStatus]) -> list[str]:
    return [f"{s.spec.name}: {p}" for s in statuses for p in s.problems]


def as_rows(statuses: list[TopicStatus]) -> list[dict[str, Any]]:
    return [
        {
            "topic": s.spec.name,
            "role": s.spec.role,
            "partitions": s.partitions,
            "timestamp": s.config.get("message.timestamp.type", "-"),
            "retention": format_duration_ms(int(s.config["retention.ms"]))
            if s.config.get("retention.ms", "-1").isdigit()
            else "-",
            "status": "ok" if not s.problems else "; ".join(s.problems),
        }
        for s in statuses
    ]
