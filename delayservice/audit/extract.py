"""Extract: both sides of the audit, read through Spark's Kafka source.

Every range is pinned to concrete offsets before Spark reads anything. Spark resolves
`latest` again for each action, so a job that writes Parquet, then a summary, then a
plot would otherwise see three different versions of a live topic and could report a
message as missing in one output and delivered in another. Pinning also fixes the
audit's "as of" instant: a message counts as missing only if its due time plus the
grace period had passed before the end offsets were taken.

The delay side is the level topics, the level markers topic and, with precise mode on,
the precise topic, pinned and windowed alike: all of them use LogAppendTime, so
`--since` and `--until` mean the broker's acceptance time on each, and an offset range
names them all the same way.

Each side is read at its own isolation level (see isolation.py): the delay topics as the
daemon reads them, the target topics as the audit was asked to. The pinned end offsets
come from a consumer at the same level, so a read_committed range ends at the last
stable offset and never waits on a transaction that is still open.

The outcomes topics (the daemon's replies to cancel and reschedule markers: level
mode's, and precise mode's when it is on) are read too, as the delay topics are, and
pinned last: the daemon may forward a moved copy before its reply is written, and a
delivery read without the reply that moved it would look early. They are read from
`--since` (less the clock skew: replies carry the daemon host's clock) to their end,
since a message accepted in the window may be moved at any time after. An older
deployment has no outcomes topic; the audit then knows of no reschedules and says so.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaException, TopicPartition

from delayservice.audit import AuditError, transform
from delayservice.audit.isolation import DEFAULT, KEY, Isolation, of_daemon
from delayservice.audit.kafka_options import PREFIX, describe, prefixed
from delayservice.kafka import client_config
from delayservice.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

EARLIEST = -2
LATEST = -1
CLOCK_SKEW_MS = 5 * 60_000
"""Target topics are read from this long before `--since`: forward timestamps come from the
daemon host's clock, acceptance times from the broker's, and the two may disagree."""

KEPT = ("topic", "partition", "offset", "timestamp", "headers")
"""Columns the audit uses; keys and values (the payload) are dropped before caching."""
REPLY_COLUMNS = ("topic", "partition", "offset", "timestamp", "key", "value")
"""A marker reply says everything in its key and value, and carries no payload."""

NO_OUTCOMES = "no reschedule is known, so each message is judged by its own due time"
"""What an audit without the outcomes topic cannot know (an older deployment)."""

Progress = Callable[[str], None]
"""Where the job reports what it is doing, one line at a time."""

Ranges = dict[str, dict[int, tuple[int, int]]]
"""topic -> partition -> (start offset, end offset), end exclusive."""


@dataclass(frozen=True)
class Window:
    """What to audit on the delay topics: a time window, an offset range, or everything."""

    since_ms: int | None = None
    until_ms: int | None = None
    starting_offsets: str | None = None
    ending_offsets: str | None = None

    def __post_init__(self) -> None:
        by_time = self.since_ms is not None or self.until_ms is not None
        by_offset = self.starting_offsets is not None or self.ending_offsets is not None
        if by_time and by_offset:
            raise AuditError(
                "give a time window (--since/--until) or an offset range "
                "(--starting-offsets/--ending-offsets), not both"
            )
        if (
            self.since_ms is not None
            and self.until_ms is not None
            and self.until_ms <= self.since_ms
        ):
            raise AuditError("--until must be after --since")


@dataclass
class Outcomes:
    """The replies to markers, read from the outcomes topics that exist."""

    records: DataFrame
    ranges: Ranges
    absent: list[str] = field(default_factory=list)
    """Outcomes topics precise mode should have and the broker does not."""


@dataclass
class Extracted:
    """Raw Kafka rows of both sides and the replies to markers, with the pinned ranges
    they came from."""

    delay_records: DataFrame
    target_records: DataFrame
    delay_ranges: Ranges
    target_ranges: Ranges
    as_of_ms: int
    outcomes: Outcomes
    targets: list[str] = field(default_factory=list)
    target_isolation: Isolation = DEFAULT
    delay_isolation: Isolation = DEFAULT


def parse_offsets(text: str | None, default: int) -> dict[str, dict[int, int]] | int:
    """Spark's offset notation: `earliest`, `latest`, or JSON such as {"t":{"0":23,"1":-2}}."""
    if text is None:
        return default
    word = text.strip().lower()
    if word == "earliest":
        return EARLIEST
    if word == "latest":
        return LATEST
    try:
        raw = json.loads(text)
        return {
            str(topic): {int(p): int(o) for p, o in parts.items()} for topic, parts in raw.items()
        }
    except (ValueError, AttributeError, TypeError) as exc:
        raise AuditError(
            f"offsets {text!r} are neither earliest, latest nor JSON like "
            '{"delay_topic_1":{"0":23,"1":-2}}'
        ) from exc


class OffsetResolver:
    """Turns times and symbolic offsets into concrete ones, with one plain Kafka consumer.

    Its isolation level decides what `latest` is: the high watermark for
    read_uncommitted, the last stable offset (below any open transaction) for
    read_committed, as the reader of the range will see it.
    """

    def __init__(
        self, settings: Settings, isolation: Isolation = DEFAULT, timeout: float = 15.0
    ) -> None:
        config = {
            **client_config.common(settings),
            "group.id": "delayservice-audit",
            "enable.auto.commit": False,
            KEY: isolation.value,
        }
        self._consumer = Consumer(config)
        self._timeout = timeout

    def close(self) -> None:
        self._consumer.close()

    def partitions(self, topics: list[str]) -> dict[str, list[int]]:
        """Partitions of the topics that exist; absent topics are left out with a warning."""
        try:
            meta = self._consumer.list_topics(timeout=self._timeout)
        except KafkaException as exc:
            raise AuditError.from_kafka(exc.args[0], "listing topics") from exc
        found = {}
        for topic in topics:
            info = meta.topics.get(topic)
            if info is None or info.error is not None:
                log.warning("topic %s does not exist; nothing to read from it", topic)
                continue
            found[topic] = sorted(info.partitions)
        return found

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        try:
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=self._timeout, cached=False
            )
        except KafkaException as exc:
            raise AuditError.from_kafka(exc.args[0], f"reading offsets of {topic}") from exc
        return int(low), int(high)

    def offset_at(self, topic: str, partition: int, timestamp_ms: int, high: int) -> int:
        """The first offset at or after `timestamp_ms`, or `high` when there is none yet."""
        try:
            found = self._consumer.offsets_for_times(
                [TopicPartition(topic, partition, timestamp_ms)], timeout=self._timeout
            )
        except KafkaException as exc:
            raise AuditError.from_kafka(exc.args[0], f"looking up times in {topic}") from exc
        offset = int(found[0].offset)
        return high if offset < 0 else offset

    def ranges(
        self,
        topics: list[str],
        *,
        start: dict[str, dict[int, int]] | int,
        end: dict[str, dict[int, int]] | int,
        since_ms: int | None = None,
        until_ms: int | None = None,
    ) -> Ranges:
        """Pinned ranges; a time bound wins over the symbolic default it replaces."""
        out: Ranges = {}
        for topic, parts in self.partitions(topics).items():
            out[topic] = {}
            for partition in parts:
                low, high = self.watermarks(topic, partition)
                first = _pick(start, topic, partition, low, high)
                last = _pick(end, topic, partition, low, high)
                if since_ms is not None:
                    first = self.offset_at(topic, partition, since_ms, high)
                if until_ms is not None:
                    last = self.offset_at(topic, partition, until_ms, high)
                first = max(low, first)
                out[topic][partition] = (first, max(first, min(last, high)))
        return out


def _pick(
    spec: dict[str, dict[int, int]] | int, topic: str, partition: int, low: int, high: int
) -> int:
    value = spec if isinstance(spec, int) else spec.get(topic, {}).get(partition, LATEST)
    if value == EARLIEST:
        return low
    if value == LATEST:
        return high
    return value


def record_count(ranges: Ranges) -> int:
    return sum(end - start for parts in ranges.values() for start, end in parts.values())


def read_kafka(
    spark: SparkSession,
    bootstrap: str,
    ranges: Ranges,
    kafka_options: Mapping[str, str],
    isolation: Isolation = DEFAULT,
) -> DataFrame:
    """A batch DataFrame of exactly these ranges, headers included (Spark's Kafka schema).

    `kafka_options` are Java client settings (see kafka_options.spark_options); they are
    applied after the bootstrap servers, so a `bootstrap.servers` among them wins, as it
    does for the daemon's own clients. `isolation` wins over any isolation level among
    them: it is the audit's choice for this side (the Java client's own default would be
    read_uncommitted).
    """
    if not ranges or record_count(ranges) == 0:
        return empty_kafka_frame(spark)
    options = prefixed(kafka_options) | {f"{PREFIX}{KEY}": isolation.value}
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "reading %d records of %s with %s",
            record_count(ranges),
            ", ".join(sorted(ranges)),
            describe(options),
        )
    reader = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("assign", json.dumps({t: sorted(p) for t, p in ranges.items()}))
        .option(
            "startingOffsets",
            json.dumps(
                {t: {str(p): r[0] for p, r in parts.items()} for t, parts in ranges.items()}
            ),
        )
        .option(
            "endingOffsets",
            json.dumps(
                {t: {str(p): r[1] for p, r in parts.items()} for t, parts in ranges.items()}
            ),
        )
        .option("includeHeaders", "true")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def kafka_schema() -> StructType:
    """The schema of Spark's Kafka source with headers, for empty frames and tests."""
    from pyspark.sql import types as T  # noqa: N812  # heavy: only when auditing

    header = T.StructType(
        [T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())]
    )
    return T.StructType(
        [
            T.StructField("key", T.BinaryType()),
            T.StructField("value", T.BinaryType()),
            T.StructField("topic", T.StringType()),
            T.StructField("partition", T.IntegerType()),
            T.StructField("offset", T.LongType()),
            T.StructField("timestamp", T.TimestampType()),
            T.StructField("timestampType", T.IntegerType()),
            T.StructField("headers", T.ArrayType(header)),
        ]
    )


def empty_kafka_frame(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame([], kafka_schema())


def precise_topic(settings: Settings) -> str | None:
    """The precise topic when precise mode is on. Off, it is not read even if it exists:
    the settings say no daemon forwards from it, so its messages would all be missing."""
    return settings.precise_topic if settings.precise else None


def precise_topics(settings: Settings) -> list[str]:
    """Every topic that holds precise-mode messages (level `exact`): the precise topic
    and the far one; none when precise mode is off."""
    main = precise_topic(settings)
    return [] if main is None else [main, settings.precise_far_topic]


def outcomes_topics(settings: Settings) -> list[str]:
    """Where the daemon replies to markers: level mode's, and with precise mode on the
    one for the markers sent to `precise_topics`."""
    precise = [settings.precise_outcomes_topic] if settings.precise else []
    return [settings.markers_outcomes_topic, *precise]


def marker_topics(settings: Settings) -> list[str]:
    """Topics markers land on, whose answers can move a message: the precise ones and
    the level markers topic."""
    return [*precise_topics(settings), settings.markers_topic]


def delay_topics(settings: Settings) -> list[str]:
    """Every topic that accepts delayed messages or their markers: the levels', the
    level markers topic, then the precise ones."""
    levels = [level.topic for level in settings.level_set()]
    return [*levels, settings.markers_topic, *precise_topics(settings)]


def pin_outcomes(
    settings: Settings, topics: list[str], since_ms: int | None, isolation: Isolation
) -> Ranges:
    """The outcomes topics' ranges, from `since_ms` (or their start) to their end now;
    a topic that does not exist is left out."""
    resolver = OffsetResolver(settings, isolation)
    try:
        return resolver.ranges(topics, start=EARLIEST, end=LATEST, since_ms=since_ms)
    finally:
        resolver.close()


def read_outcomes(
    spark: SparkSession,
    settings: Settings,
    window: Window,
    *,
    kafka_options: Mapping[str, str],
    progress: Progress,
    isolation: Isolation,
) -> Outcomes:
    """Pin and read the outcomes topics (see the module's docstring for when and why)."""
    topics = outcomes_topics(settings)
    since = None if window.since_ms is None else window.since_ms - CLOCK_SKEW_MS
    ranges = pin_outcomes(settings, topics, since, isolation) if topics else {}
    absent = [topic for topic in topics if topic not in ranges]
    for topic in absent:
        progress(f"outcomes topic {topic} does not exist: {NO_OUTCOMES}")
    if ranges:
        progress(
            f"outcomes topic {', '.join(ranges)} ({isolation.value}): "
            f"{record_count(ranges)} records"
        )
    records = (
        read_kafka(spark, settings.bootstrap_servers, ranges, kafka_options, isolation)
        .select(*REPLY_COLUMNS)
        .persist()
    )
    return Outcomes(records, ranges, absent)


def extract(
    spark: SparkSession,
    settings: Settings,
    window: Window,
    *,
    targets: list[str] | None,
    kafka_options: Mapping[str, str],
    progress: Progress,
    isolation: Isolation = DEFAULT,
) -> Extracted:
    """Pin both sides, read the delay topics, discover targets unless given, read those,
    then the outcomes topics (the target topics at `isolation`, the others as the daemon
    reads them)."""
    levels = settings.level_set()
    daemon_isolation = of_daemon(settings)
    resolver = OffsetResolver(settings, daemon_isolation)
    try:
        as_of_ms = int(time.time() * 1000)
        delay_ranges = resolver.ranges(
            delay_topics(settings),
            start=parse_offsets(window.starting_offsets, EARLIEST),
            end=parse_offsets(window.ending_offsets, LATEST),
            since_ms=window.since_ms,
            until_ms=window.until_ms,
        )
        if not delay_ranges:
            names = f"{levels.levels[0].topic}..{levels.levels[-1].topic}"
            check = "levels and topic_prefix"
            precise = precise_topics(settings)
            if precise:
                names = f"{names} or {', '.join(precise)}"
                check = "levels, topic_prefix and precise_topic"
            raise AuditError(f"none of the delay topics {names} exists; check the {check} settings")
        progress(
            f"delay topics ({daemon_isolation.value}): {record_count(delay_ranges)} records "
            f"in {sum(len(p) for p in delay_ranges.values())} partitions"
        )
        delay_records = (
            read_kafka(
                spark, settings.bootstrap_servers, delay_ranges, kafka_options, daemon_isolation
            )
            .select(*KEPT)
            .persist()
        )
        if targets is None:
            progress("finding the target topics named in the envelopes")
            targets = transform.target_topics(delay_records)
    finally:
        resolver.close()
    target_since = None if window.since_ms is None else window.since_ms - CLOCK_SKEW_MS
    # Taken after as_of, so a delivery made meanwhile counts: that can only turn
    # "missing" into "delivered late", never hide a message that was not delivered.
    target_resolver = OffsetResolver(settings, isolation)
    try:
        target_ranges = target_resolver.ranges(
            targets, start=EARLIEST, end=LATEST, since_ms=target_since
        )
    finally:
        target_resolver.close()
    progress(
        f"target topics {', '.join(targets) or '(none)'} ({isolation.value}): "
        f"{record_count(target_ranges)} offsets"
    )
    target_records = (
        read_kafka(spark, settings.bootstrap_servers, target_ranges, kafka_options, isolation)
        .select(*KEPT)
        .persist()
    )
    outcomes = read_outcomes(
        spark,
        settings,
        window,
        kafka_options=kafka_options,
        progress=progress,
        isolation=daemon_isolation,
    )
    return Extracted(
        delay_records,
        target_records,
        delay_ranges,
        target_ranges,
        as_of_ms,
        outcomes,
        targets,
        target_isolation=isolation,
        delay_isolation=daemon_isolation,
    )
