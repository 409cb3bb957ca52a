"""Transform: parse both sides and reconcile them by `delay-id` (`summary` counts the verdicts).

Nothing here talks to Kafka, so every rule can be tested on a handful of rows built in
the test. The rules:

- accepted: a delay-topic record with a valid version-1 envelope that is not a marker
  (a record carrying `delay-cancel` or `delay-reschedule` is one whatever else it
  carries, as the precise intake reads it). Its due time follows the daemon's rule
  (`forward/sender.py`, `precise/intake/admission.py`), recomputed here rather than trusted from
  the daemon, from the record's timestamp (LogAppendTime, the broker's clock): on a
  level topic, append time + max(level delay, `delay-ms`), and never before
  `delay-due-ms` when the envelope carries one, since the envelope only ever asks for
  more; on the precise topic (precise mode, shown as level `exact`), which has no level
  delay, max(append time + `delay-ms`, `delay-due-ms`). An id accepted twice counts
  once, from its first acceptance.
- delivered: a target-topic record carrying that `delay-id`; lateness is its first
  delivery's timestamp minus the due time.
- duplicated: delivered more than once. early: first delivered before it was due.
- cancelled: a `delay-cancel: <id>` marker was appended before the id was due (before
  or after the message itself); a marker that arrives after the due time is too late
  and changes nothing, except in precise mode, where the daemon still calls off a
  message it has not sent yet (it was running late): a precise message with its marker
  in place and no delivery counts as cancelled, not missing. Where the marker counts
  follows where the daemon can read it:
  for a precise message, only on the precise-topic partition that holds the message
  (where `DelayProducer.cancel` sends it, and the only partition the instance holding
  the message is sure to read); for a level message, anywhere but a precise topic: on
  the level markers topic (where `DelayProducer.cancel` sends it, and which every
  daemon reads whole), or on a level topic (the rule from before cancel existed).
- delivered wins over cancelled, and the two are not exclusive: a message delivered
  although its cancel came in time has status `delivered` with both flags set, and
  counts as both delivered and cancelled. For a level message whose cancel came at
  least `cancel_lead` before the due time that is a broken promise, counted as
  `leaked` (`BROKEN`). Closer to the due time a cancel races the forward (it is
  promised only when the daemon read it first), so it stays visible without failing
  the audit; so does a precise message's, which the audit cannot tell from a cancel
  its intake read after the message (a marker before its message, on another member).
  Hence accepted = delivered + missing + pending + (cancelled and not delivered).
- missing: not delivered, not cancelled, and due plus the grace period had passed when
  the audit pinned its input. Not yet that old: pending, judged by a later audit.
- moved: a message rescheduled by id (precise mode) is due when its last move says, not
  when its own record says. The daemon answers each reschedule marker on the outcomes
  topic (`markers/replies.py`), keyed by where the marker landed; a marker's
  record says only what was asked, its reply what was done. A move is matched by id
  alone: the daemon answers `moved` only for a message it holds. A reply counts when
  it is a version-1 JSON object saying a reschedule `moved` a non-empty id to a
  `due_ms`, and its key names a marker on a precise topic; anything else, malformed or
  not, changes nothing, since whoever can write the precise topic can write the
  outcomes topic too. Replies are deduplicated by key (owner and replica answer the
  same marker, and a marker read again after a crash is answered again): the first
  `moved` reply per key stands. Of an id's moved markers the one with the highest
  offset wins: all markers for one id go to the partition that holds it, in the order
  they were sent, and a later marker replaces an earlier one's move whatever order the
  replies came in. The winner's `due_ms` is the due time for early, lateness, missing,
  pending and whether a cancel came in time. Other outcomes (`too_late`, `unmatched`,
  `cancelled`, `refused`, `superseded`) leave the due time as it was.
- superseded: a moved message with a delivered copy whose `delay-due-ms` is not the due
  time its last move gave it: a copy sent at a time a later reschedule had replaced
  (its own record's, or an earlier move's). Any copy counts, not only the first. The
  message was promised at one time and went out at another, so this breaks a promise
  as early and missing do (`BROKEN`). A copy without `delay-due-ms` cannot be judged
  and is not counted. A level message's move is answered on the level outcomes topic
  the same way, and its copy waits on the level that holds what is left, so its
  delivered `delay-due-ms` is the copy's level due time, at or after the time asked: a
  level copy is superseded when it carries a due time before the time asked, or the
  original's (the original itself went out).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from delayservice.audit import H_CANCEL, PRECISE_LEVEL
from delayservice.envelope import (
    H_DELAY_MS,
    H_DUE_MS,
    H_ID,
    H_RESCHEDULE,
    H_TARGET,
    H_VERSION,
    VERSION,
)
from delayservice.levels import LevelSet

if TYPE_CHECKING:
    from types import ModuleType

    from pyspark.sql import Column, DataFrame

REPLY_SCHEMA = (
    "v int, kind string, id string, outcome string, due_ms bigint, member int, role string"
)
"""A marker reply's JSON (`markers/replies.py`). A field of another JSON type
reads as null (a number where a string is expected reads as its text)."""
REPLY_KEY = r"^(.+):([0-9]+):([0-9]+)$"
"""`topic:partition:offset` of the marker a reply answers; Kafka topic names hold no colon."""


def spark_functions() -> ModuleType:
    """`pyspark.sql.functions`, imported on first use (by `summary` too), never at import."""
    from pyspark.sql import functions  # heavy: only when auditing

    return functions


def header(name: str) -> Column:
    """The first header called `name` as text, or null when the record has none."""
    F = spark_functions()  # noqa: N806  # the PySpark convention
    found = F.try_element_at(F.filter("headers", lambda h: h["key"] == name), F.lit(1))
    text: Column = found.getField("value").cast("string")
    return text


def _millis(column: str) -> Column:
    millis: Column = spark_functions().unix_millis(column)
    return millis


def _parsed_delay_side(delay_records: DataFrame) -> DataFrame:
    return delay_records.select(
        "topic",
        "partition",
        "offset",
        _millis("timestamp").alias("append_ms"),
        header(H_VERSION).alias("version"),
        header(H_ID).alias("id"),
        header(H_TARGET).alias("target"),
        header(H_DELAY_MS).try_cast("bigint").alias("delay_ms"),
        header(H_DUE_MS).alias("due_text"),
        header(H_DUE_MS).try_cast("bigint").alias("requested_due_ms"),
        header(H_CANCEL).alias("cancel_id"),
        header(H_RESCHEDULE).alias("reschedule_id"),
    )


def target_topics(delay_records: DataFrame) -> list[str]:
    """The real topics the envelopes name, so the audit reads only those."""
    rows = (
        _valid(_parsed_delay_side(delay_records))
        .select("target")
        .distinct()
        .orderBy("target")
        .collect()
    )
    return [str(r["target"]) for r in rows]


def _valid(parsed: DataFrame) -> DataFrame:
    F = spark_functions()  # noqa: N806
    return parsed.where(
        F.col("cancel_id").isNull()
        & F.col("reschedule_id").isNull()
        & (F.col("version") == str(VERSION))
        & (F.length("id") > 0)
        & (F.length("target") > 0)
        & (F.col("delay_ms") >= 0)
        # The daemon dead-letters a malformed delay-due-ms; only an absent one is optional.
        & (F.col("due_text").isNull() | (F.col("requested_due_ms") >= 0))
    )


def accepted(
    delay_records: DataFrame,
    levels: LevelSet,
    targets: list[str] | None = None,
    *,
    precise_topics: Sequence[str] = (),
) -> DataFrame:
    """One row per accepted id: level, requested delay, append time and due time.

    With `targets`, only messages bound for those topics: the others' deliveries are not
    read, and counting them would report every one of them as missing. The messages of
    `precise_topics` (precise mode on) count too, as level `exact`, indexed after the
    last level so tables and plots show it last; its level delay is null.
    """
    F = spark_functions()  # noqa: N806
    spark = delay_records.sparkSession
    topics: list[tuple[str, int, str, int | None]] = [
        (lv.topic, lv.index, lv.name, lv.delay_ms) for lv in levels
    ]
    topics.extend((topic, len(levels) + 1, PRECISE_LEVEL, None) for topic in precise_topics)
    level_rows = spark.createDataFrame(
        topics, "topic string, level_index int, level string, level_delay_ms bigint"
    )
    valid = _valid(_parsed_delay_side(delay_records)).join(F.broadcast(level_rows), "topic")
    if targets is not None:
        valid = valid.where(F.col("target").isin(targets))
    first = F.min_by(F.struct(*[c for c in valid.columns if c != "id"]), "append_ms")
    held_ms = F.greatest(F.coalesce("level_delay_ms", F.lit(0)), F.col("delay_ms"))
    due_ms = F.greatest(F.col("append_ms") + held_ms, F.coalesce("requested_due_ms", F.lit(0)))
    return (
        valid.groupBy("id")
        .agg(first.alias("r"), F.count("*").alias("accepted_copies"))
        .select("id", "r.*", "accepted_copies")
        .drop("version", "cancel_id", "reschedule_id", "due_text")
        .withColumn("due_ms", due_ms)
    )


def cancels(delay_records: DataFrame, precise_topics: Sequence[str] = ()) -> DataFrame:
    """The earliest cancel marker per id and place: `cancel_topic` and `cancel_partition`
    say where a marker on one of `precise_topics` landed, both null for one on a level
    topic (see the module's rules for which place counts for which message)."""
    F = spark_functions()  # noqa: N806
    parsed = _parsed_delay_side(delay_records)
    on_precise = F.col("topic").isin(list(precise_topics))
    return (
        parsed.where(F.length("cancel_id") > 0)
        .groupBy(
            F.col("cancel_id").alias("id"),
            F.when(on_precise, F.col("topic")).alias("cancel_topic"),
            F.when(on_precise, F.col("partition")).alias("cancel_partition"),
        )
        .agg(F.min("append_ms").alias("cancel_ms"))
    )


def replies(outcome_records: DataFrame) -> DataFrame:
    """Every record of the outcomes topics read as a marker reply: where its marker
    landed (null when the key does not say) and the fields of its JSON value (null when
    the value is not a JSON object, field by field when one has the wrong type)."""
    F = spark_functions()  # noqa: N806
    key = F.col("key").cast("string")
    value = F.from_json(F.col("value").cast("string"), REPLY_SCHEMA)
    return (
        outcome_records.select(
            F.col("offset").alias("reply_offset"),
            key.alias("marker"),
            F.nullif(F.regexp_extract(key, REPLY_KEY, 1), F.lit("")).alias("marker_topic"),
            F.regexp_extract(key, REPLY_KEY, 2).try_cast("int").alias("marker_partition"),
            F.regexp_extract(key, REPLY_KEY, 3).try_cast("bigint").alias("marker_offset"),
            value.alias("reply"),
        )
        .select("*", "reply.*")
        .drop("reply")
    )


def moves(outcome_records: DataFrame, precise_topics: Sequence[str]) -> DataFrame:
    """Per message id, the due time its last move gave it (`moved_due_ms`) and the marker
    that decided (`moved_by`, as `topic:partition:offset`); ids never moved are absent."""
    F = spark_functions()  # noqa: N806
    moved = replies(outcome_records).where(
        (F.col("v") == VERSION)
        & (F.col("kind") == "reschedule")
        & (F.col("outcome") == "moved")
        & (F.length("id") > 0)
        & (F.col("due_ms") >= 0)
        & F.col("marker_topic").isin(list(precise_topics))
        & F.col("marker_partition").isNotNull()
        & F.col("marker_offset").isNotNull()
    )
    # The first moved reply per marker: the others are its other holder's, or a re-read's.
    place = ("marker_topic", "marker_partition", "marker_offset")
    per_marker = (
        moved.groupBy(*place)
        .agg(F.min_by(F.struct("id", "due_ms", "marker"), "reply_offset").alias("r"))
        .select(*place, "r.*")
    )
    last = F.max_by(F.struct("due_ms", "marker"), F.struct("marker_offset", *place))
    return (
        per_marker.groupBy("id")
        .agg(last.alias("m"))
        .select("id", F.col("m.due_ms").alias("moved_due_ms"), F.col("m.marker").alias("moved_by"))
    )


def deliveries(target_records: DataFrame) -> DataFrame:
    """Every record on a target topic that carries a `delay-id`, one row per copy."""
    F = spark_functions()  # noqa: N806
    return target_records.select(
        header(H_ID).alias("id"),
        F.col("topic").alias("delivered_topic"),
        F.col("partition").alias("delivered_partition"),
        F.col("offset").alias("delivered_offset"),
        _millis("timestamp").alias("forward_ms"),
        header(H_DUE_MS).try_cast("bigint").alias("delivered_due_ms"),
    ).where(F.length("id") > 0)


def _deliveries_per_id(delivered: DataFrame, judged: DataFrame) -> DataFrame:
    """Copies per id, the first copy's place, and how many copies carry a due time the
    id's last move replaced (null compares as unknown, and is not counted): for an exact
    message any other than the move's; for a level one, one before it or the original's
    (a level copy is due at its level, at or after the time asked)."""
    F = spark_functions()  # noqa: N806
    first = F.min_by(
        F.struct("delivered_topic", "delivered_partition", "delivered_offset", "delivered_due_ms"),
        "forward_ms",
    )
    due = F.col("delivered_due_ms")
    stale = F.when(F.col("level") == PRECISE_LEVEL, due != F.col("moved_due_ms")).otherwise(
        (due < F.col("moved_due_ms"))
        | ((due == F.col("original_due_ms")) & (F.col("moved_due_ms") != F.col("original_due_ms")))
    )
    return (
        delivered.join(
            judged.select("id", "moved_due_ms", "original_due_ms", "level"), "id", "left"
        )
        .groupBy("id")
        .agg(
            F.count("*").alias("deliveries"),
            F.min("forward_ms").alias("first_forward_ms"),
            F.max("forward_ms").alias("last_forward_ms"),
            first.alias("d"),
            F.count_if(stale).alias("superseded_copies"),
        )
        .select("*", "d.*")
        .drop("d")
    )


def _with_cancels(joined: DataFrame, cancel_marks: DataFrame) -> DataFrame:
    """Each message with the earliest cancel marker from where its holder reads them:
    its own precise-topic partition for an exact message, any level topic otherwise."""
    F = spark_functions()  # noqa: N806
    exact = F.col("level") == PRECISE_LEVEL
    keyed = joined.withColumn("cancel_key_topic", F.when(exact, F.col("topic"))).withColumn(
        "cancel_key_partition", F.when(exact, F.col("partition"))
    )
    marks = cancel_marks.withColumnRenamed("id", "cancel_id")
    same_place = keyed["cancel_key_topic"].eqNullSafe(marks["cancel_topic"]) & keyed[
        "cancel_key_partition"
    ].eqNullSafe(marks["cancel_partition"])
    return keyed.join(marks, (keyed["id"] == marks["cancel_id"]) & same_place, "left").drop(
        "cancel_key_topic",
        "cancel_key_partition",
        "cancel_id",
        "cancel_topic",
        "cancel_partition",
    )


def reconcile(
    accepted_ids: DataFrame,
    cancel_marks: DataFrame,
    delivered: DataFrame,
    moved: DataFrame,
    *,
    as_of_ms: int,
    grace_ms: int,
    cancel_lead_ms: int = 0,
) -> DataFrame:
    """One row per accepted message with its verdict; the Parquet output. `due_ms` is
    the due time it is judged by: its last move's (`moves`), else its own record's,
    which stays beside it as `original_due_ms`. `cancel_lead_ms`: the daemons'
    `cancel_lead`, within which a cancel before the due time may lose the race."""
    F = spark_functions()  # noqa: N806
    judged = (
        accepted_ids.withColumnRenamed("due_ms", "original_due_ms")
        .join(moved, "id", "left")
        .withColumn("due_ms", F.coalesce("moved_due_ms", "original_due_ms"))
    )
    joined = judged.join(_deliveries_per_id(delivered, judged), "id", "left")
    m = (
        _with_cancels(joined, cancel_marks)
        .withColumn("deliveries", F.coalesce("deliveries", F.lit(0)))
        .withColumn("superseded_copies", F.coalesce("superseded_copies", F.lit(0)))
    )
    return _verdicts(m, as_of_ms=as_of_ms, grace_ms=grace_ms, lead_ms=cancel_lead_ms)


def _verdicts(m: DataFrame, *, as_of_ms: int, grace_ms: int, lead_ms: int) -> DataFrame:
    F = spark_functions()  # noqa: N806
    is_delivered = F.col("deliveries") > 0
    in_time = F.col("cancel_ms") < F.col("due_ms")
    # Both modes promise a cancel acknowledged `cancel_lead` before the due time.
    promised = F.col("cancel_ms") < F.col("due_ms") - F.lit(lead_ms)
    # Precise mode calls off a message it has not sent yet even after its due time (a
    # late daemon): not delivered with a marker in place is a cancel honoured, not a loss.
    honoured_late = (
        (F.col("level") == PRECISE_LEVEL) & F.col("cancel_ms").isNotNull() & ~is_delivered
    )
    is_cancelled = F.coalesce(in_time | honoured_late, F.lit(False))
    overdue = F.col("due_ms") + F.lit(grace_ms) <= F.lit(as_of_ms)
    return (
        m.withColumn("delivered", is_delivered)
        .withColumn("cancelled", is_cancelled)
        .withColumn("duplicated", F.col("deliveries") > 1)
        .withColumn("early", is_delivered & (F.col("first_forward_ms") < F.col("due_ms")))
        .withColumn("superseded", F.col("superseded_copies") > 0)
        .withColumn("missing", ~is_delivered & ~is_cancelled & overdue)
        .withColumn("pending", ~is_delivered & ~is_cancelled & ~overdue)
        .withColumn(
            "leaked",
            is_delivered & F.coalesce(promised, F.lit(False)) & (F.col("level") != PRECISE_LEVEL),
        )
        .withColumn("lateness_ms", F.col("first_forward_ms") - F.col("due_ms"))
        .withColumn(
            "status",
            F.when(is_delivered, "delivered")
            .when(is_cancelled, "cancelled")
            .when(overdue, "missing")
            .otherwise("pending"),
        )
    )


def moved_count(messages: DataFrame) -> int:
    """Messages judged by a due time a reschedule gave them."""
    F = spark_functions()  # noqa: N806
    return int(messages.where(F.col("moved_due_ms").isNotNull()).count())


def unmatched(delivered: DataFrame, accepted_ids: DataFrame) -> int:
    """Delivered ids with no acceptance in the audited range (outside the window, or foreign)."""
    return int(
        delivered.select("id").distinct().join(accepted_ids.select("id"), "id", "left_anti").count()
    )
