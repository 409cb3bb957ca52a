"""The audit job: extract, transform, load, and a verdict for the exit status.

Per-message rows are written to Parquet first and every later figure is computed from
that file, so the summary, the plot and the Parquet always describe the same rows, and
the input is read from Kafka once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from delayservice.audit import EXIT_OK, EXIT_VIOLATIONS, jars, load, session, summary, transform
from delayservice.audit.extract import (
    NO_OUTCOMES,
    Extracted,
    Progress,
    Window,
    extract,
    marker_topics,
    precise_topic,
    precise_topics,
    record_count,
)
from delayservice.audit.isolation import DEFAULT, Isolation, refuse_explicit
from delayservice.audit.isolation import header as isolation_header
from delayservice.audit.kafka_options import describe, spark_options
from delayservice.audit.summary import SummaryRow
from delayservice.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_GRACE_MS = 60_000


@dataclass(frozen=True)
class AuditOptions:
    """What one audit run does. `kafka_options` are explicit Java client settings for
    Spark's Kafka source, laid over the settings file's own Kafka settings (translated
    from librdkafka) unless `kafka_settings` is off. They may hold credentials, so they
    stay out of the repr. `isolation` is how the target topics are read (isolation.py)."""

    window: Window = field(default_factory=Window)
    grace_ms: int = DEFAULT_GRACE_MS
    targets: list[str] | None = None
    out_dir: Path = Path("delayservice-audit")
    master: str | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)
    kafka_options: dict[str, str] = field(default_factory=dict, repr=False)
    spark_progress_bar: bool = False
    kafka_settings: bool = True
    isolation: Isolation = DEFAULT


@dataclass
class AuditReport:
    rows: list[SummaryRow]
    document: dict[str, Any]
    outputs: dict[str, Path]

    @property
    def header(self) -> str:
        """How each side was read, the first line of the report."""
        return str(self.document["isolation"]["header"])

    @property
    def total(self) -> SummaryRow:
        return next(r for r in self.rows if r.scope == "total")

    @property
    def ok(self) -> bool:
        return bool(self.document["ok"])

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.ok else EXIT_VIOLATIONS

    @property
    def note(self) -> str | None:
        """What the audit could not take into account, if anything."""
        note = self.document["reschedules"]["note"]
        return None if note is None else str(note)


def _log_progress(message: str) -> None:
    log.info("%s", message)


def run(
    settings: Settings,
    options: AuditOptions,
    progress: Progress = _log_progress,
    spark: SparkSession | None = None,
) -> AuditReport:
    """Run the audit; starts (and stops) its own SparkSession unless one is passed in."""
    session.require_extras()
    # Before Spark starts: a Kafka setting the audit cannot translate fails in a second.
    kafka = kafka_client_options(settings, options)
    if spark is not None:
        return audit(spark, settings, options, progress, kafka_options=kafka)
    progress("preparing Spark's Kafka connector")
    conf = session.spark_conf(
        jars.connector_jars(), options.spark_conf, show_progress=options.spark_progress_bar
    )
    progress(f"starting Spark ({options.master or session.DEFAULT_MASTER})")
    own = session.start(options.master, conf)
    try:
        return audit(own, settings, options, progress, kafka_options=kafka)
    finally:
        own.stop()


def kafka_client_options(settings: Settings, options: AuditOptions) -> dict[str, str]:
    """Spark's Kafka source options: the settings file's `kafka` and `consumer` keys in
    the Java client's terms, so the audit connects as the daemon does, then the explicit
    options on top. The isolation level is not among them: the audit sets it per side."""
    refuse_explicit(options.kafka_options)
    return spark_options(settings, options.kafka_options, from_settings=options.kafka_settings)


def audit(
    spark: SparkSession,
    settings: Settings,
    options: AuditOptions,
    progress: Progress,
    *,
    kafka_options: Mapping[str, str] | None = None,
) -> AuditReport:
    """The audit on a running SparkSession; `kafka_options` when already translated."""
    started = time.monotonic()
    levels = settings.level_set()
    if kafka_options is None:
        kafka_options = kafka_client_options(settings, options)
    progress(f"Kafka client settings for Spark: {describe(kafka_options)}")
    data = extract(
        spark,
        settings,
        options.window,
        targets=options.targets,
        kafka_options=kafka_options,
        progress=progress,
        isolation=options.isolation,
    )
    try:
        # Rows, not offsets: at read_committed a range also spans transaction markers
        # and aborted records the reader skips.
        records_read = {
            "delay_topics": data.delay_records.count(),
            "target_topics": data.target_records.count(),
            "outcomes_topics": data.outcomes.records.count(),
        }
        precise = precise_topics(settings)
        accepted = transform.accepted(
            data.delay_records, levels, options.targets, precise_topics=precise
        )
        delivered = transform.deliveries(data.target_records)
        messages = transform.reconcile(
            accepted,
            transform.cancels(data.delay_records, precise),
            delivered,
            transform.moves(data.outcomes.records, marker_topics(settings)),
            as_of_ms=data.as_of_ms,
            grace_ms=options.grace_ms,
            cancel_lead_ms=settings.cancel_lead_ms,
        )
        options.out_dir.mkdir(parents=True, exist_ok=True)
        progress("reconciling both sides by delay-id, writing one row per message")
        parquet = load.write_messages(messages, options.out_dir)
        written = spark.read.parquet(str(parquet))
        progress("counting per level and per target")
        rows = summary.collect_summary(summary.summarize(written))
        unmatched = transform.unmatched(delivered, accepted)
        moved = transform.moved_count(written)
        progress("plotting lateness per level")
        plot = load.plot_lateness(summary.lateness_histogram(written), rows, options.out_dir)
    finally:
        data.delay_records.unpersist()
        data.target_records.unpersist()
        data.outcomes.records.unpersist()
    outputs = {"messages": parquet, "plot": plot, "summary": options.out_dir / load.SUMMARY}
    document = _document(
        settings,
        options,
        data,
        rows=rows,
        records_read=records_read,
        unmatched=unmatched,
        moved=moved,
        outputs=outputs,
        seconds=time.monotonic() - started,
    )
    load.write_summary(document, options.out_dir)
    return AuditReport(rows, document, outputs)


def _reschedules(data: Extracted, moved: int) -> dict[str, Any]:
    """Where the moves came from, how many messages they moved, and a note when the
    outcomes topic is absent: the audit then judges a moved message by its old time."""
    absent = data.outcomes.absent
    note = None
    if absent:
        note = (
            f"outcomes topic {', '.join(absent)} does not exist (a deployment from before "
            f"reschedules): {NO_OUTCOMES}"
        )
    return {"outcomes_topics": sorted(data.outcomes.ranges), "messages_moved": moved, "note": note}


def _document(
    settings: Settings,
    options: AuditOptions,
    data: Extracted,
    *,
    rows: list[SummaryRow],
    records_read: dict[str, int],
    unmatched: int,
    moved: int,
    outputs: dict[str, Path],
    seconds: float,
) -> dict[str, Any]:
    total = next(r for r in rows if r.scope == "total")
    return {
        "ok": summary.promises_kept(total.counts),
        # Duplicates are what a reader at this level sees: read_uncommitted counts the
        # copies aborted transactions left on the target topics, read_committed does not.
        "isolation": {
            "target_topics": data.target_isolation.value,
            "delay_topics": data.delay_isolation.value,
            "header": isolation_header(data.target_isolation, data.delay_isolation),
        },
        "as_of": datetime.fromtimestamp(data.as_of_ms / 1000, UTC).isoformat(),
        "as_of_ms": data.as_of_ms,
        "grace_ms": options.grace_ms,
        "levels": settings.level_set().spec(),
        "topic_prefix": settings.topic_prefix,
        "precise_topic": precise_topic(settings),
        "window": asdict(options.window),
        "targets": data.targets,
        "records_read": records_read,
        "offsets_spanned": {
            "delay_topics": record_count(data.delay_ranges),
            "target_topics": record_count(data.target_ranges),
            "outcomes_topics": record_count(data.outcomes.ranges),
        },
        "reschedules": _reschedules(data, moved),
        "unmatched_deliveries": unmatched,
        "total": total.as_dict(),
        "by_level": [r.as_dict() for r in rows if r.scope == "level"],
        "by_target": [r.as_dict() for r in rows if r.scope == "target"],
        "by_level_and_target": [r.as_dict() for r in rows if r.scope == "level+target"],
        "outputs": {name: str(path) for name, path in outputs.items()},
        "seconds": round(seconds, 1),
    }
