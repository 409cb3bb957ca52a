"""The audit's plain-Python parts: option parsing, offset ranges, jar selection, formatting."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from delayservice.audit import PRECISE_LEVEL, AuditError, jars, job, load, session
from delayservice.audit.extract import (
    EARLIEST,
    LATEST,
    Window,
    _pick,
    delay_topics,
    outcomes_topics,
    parse_offsets,
    precise_topics,
)
from delayservice.audit.summary import COUNTS, SummaryRow, bin_width, promises_kept
from delayservice.cli.app import app
from delayservice.cli.audit_command import parse_instant
from delayservice.settings import Settings

NOW = 1_700_000_000_000


def test_offsets_in_sparks_notation():
    assert parse_offsets(None, LATEST) == LATEST
    assert parse_offsets("earliest", LATEST) == EARLIEST
    assert parse_offsets(" Latest ", EARLIEST) == LATEST
    assert parse_offsets('{"t": {"0": 5, "1": -2}}', LATEST) == {"t": {0: 5, 1: -2}}
    with pytest.raises(AuditError, match="neither earliest"):
        parse_offsets("yesterday", LATEST)
    with pytest.raises(AuditError):
        parse_offsets("[1, 2]", LATEST)


def test_symbolic_offsets_become_watermarks_and_unnamed_partitions_default_to_latest():
    spec = {"t": {0: 5, 1: EARLIEST}}
    assert _pick(spec, "t", 0, 2, 9) == 5
    assert _pick(spec, "t", 1, 2, 9) == 2
    assert _pick(spec, "t", 2, 2, 9) == 9
    assert _pick(EARLIEST, "u", 0, 2, 9) == 2


def test_a_window_is_by_time_or_by_offset_never_both():
    with pytest.raises(AuditError, match="not both"):
        Window(since_ms=1, starting_offsets="earliest")
    with pytest.raises(AuditError, match="after --since"):
        Window(since_ms=10, until_ms=10)
    assert Window(since_ms=1, until_ms=2).until_ms == 2


def test_instants_as_iso_epoch_or_duration_ago():
    assert parse_instant("2h", NOW) == NOW - 7_200_000
    assert parse_instant(str(NOW), 0) == NOW
    assert parse_instant("2023-11-14T22:13:20", 0) == NOW  # naive means UTC
    assert parse_instant("2023-11-14T23:13:20+01:00", 0) == NOW
    with pytest.raises(ValueError, match="duration ago"):
        parse_instant("last tuesday", NOW)


def test_the_precise_topics_are_delay_topics_only_in_precise_mode():
    base = {"levels": "1s,2s", "topic_prefix": "dt_", "precise_topic": "dp"}
    markers = Settings(**base).markers_topic  # level cancels and moves, in every mode
    assert delay_topics(Settings(**base, precise=False)) == ["dt_1", "dt_2", markers]
    assert delay_topics(Settings(**base, precise=True)) == [
        "dt_1",
        "dt_2",
        markers,
        "dp",
        "dp_far",
    ]
    assert (precise_topics(Settings(**base, precise=False)), outcomes_topics(Settings(**base))) == (
        [],
        [f"{markers}_outcomes"],
    )
    assert precise_topics(Settings(**base, precise=True)) == ["dp", "dp_far"]
    assert outcomes_topics(Settings(**base, precise=True)) == [f"{markers}_outcomes", "dp_outcomes"]


def test_exact_is_the_daemons_own_label_for_precise_mode():
    from delayservice.precise.precise_worker import LEVEL_NAME

    assert PRECISE_LEVEL == LEVEL_NAME


def test_only_jars_pyspark_lacks_are_kept():
    listing = """
The following files have been resolved:
   org.apache.spark:spark-sql-kafka-0-10_2.13:jar:4.0.0:compile
   org.apache.kafka:kafka-clients:jar:3.9.0:compile -- module kafka.clients
   org.apache.hadoop:hadoop-client-runtime:jar:3.4.1:compile
   org.slf4j:slf4j-api:jar:1.7.36:runtime
   org.apache.commons:commons-pool2:jar:2.12.0:compile
   junit:junit:jar:4.13:test
"""
    shipped = [
        "hadoop-client-runtime-3.4.1.jar",
        "slf4j-api-2.0.16.jar",
        "commons-pool-1.5.4.jar",
        "spark-sql_2.13-4.0.0.jar",
    ]
    assert jars.needed_jars(listing, shipped) == [
        "commons-pool2-2.12.0.jar",
        "kafka-clients-3.9.0.jar",
        "spark-sql-kafka-0-10_2.13-4.0.0.jar",
    ]


def test_spark_defaults_yield_to_the_user_and_keep_their_jars(tmp_path):
    jar = tmp_path / "connector.jar"
    conf = session.spark_conf(
        [jar], {"spark.driver.memory": "4g", "spark.jars": "/x/mine.jar"}, show_progress=False
    )
    assert conf["spark.driver.memory"] == "4g"
    assert conf["spark.sql.shuffle.partitions"] == session.DEFAULTS["spark.sql.shuffle.partitions"]
    assert conf["spark.jars"] == f"{jar},/x/mine.jar"


def test_round_histogram_bins():
    assert bin_width(0, 1000, 40) == 50
    assert bin_width(-5, 1000, 10) == 200
    assert bin_width(0, 0, 40) == 1
    assert bin_width(0, 7, 40) == 1


def test_durations_read_like_a_person_writes_them():
    assert [load.human_ms(v) for v in (None, 0, 12.4, -5, 1250, 184_000)] == [
        "-",
        "0ms",
        "12ms",
        "-5ms",
        "1.25s",
        "3m04s",
    ]


def test_console_table_puts_the_total_last_under_a_rule():
    def row(scope, level, target, accepted):
        counts = dict.fromkeys(COUNTS, 0) | {"accepted": accepted}
        lateness = {"p50": 1.0, "p95": 2.0, "p99": 3.0, "max": 4.0}
        return SummaryRow(
            scope, 1 if level else None, level, 1000 if level else None, target, counts, lateness
        )

    lines = load.console_table(
        [
            row("level", "1s", None, 2),
            row("target", None, "orders", 2),
            row("level+target", "1s", "orders", 2),
            row("total", None, None, 2),
        ]
    ).splitlines()
    assert len(lines) == 6  # the level+target row stays in the JSON
    assert set(lines[-2]) == {"-"}
    zeros = ["0"] * (len(COUNTS) - 1)  # every count but accepted
    assert lines[-1].split() == ["total", "2", *zeros, "1ms", "2ms", "3ms", "4ms"]


@pytest.mark.parametrize(
    "args",
    [
        ["--since", "1h", "--starting-offsets", "earliest"],
        ["--since", "someday"],
        ["--grace", "soon"],
        ["--conf", "no-equals-sign"],
    ],
)
def test_bad_options_exit_2_before_spark_starts(args, monkeypatch):
    monkeypatch.setattr(jars, "connector_jars", lambda *_: pytest.fail("Spark was prepared"))
    result = CliRunner().invoke(app, ["audit", *args])
    assert result.exit_code == 2, result.output


@pytest.mark.spark
def test_a_second_resolution_needs_neither_maven_nor_the_network(spark_available, monkeypatch):
    first = jars.connector_jars()
    assert any(j.name.startswith(jars.CONNECTOR_ARTIFACT) for j in first)
    monkeypatch.setattr(jars.shutil, "which", lambda _: None)
    assert jars.connector_jars() == first


def test_the_command_prints_the_note_and_fails_on_a_superseded_message(monkeypatch, tmp_path):
    counts = dict.fromkeys(COUNTS, 0) | {"accepted": 1, "delivered": 1, "superseded": 1}
    lateness = dict.fromkeys(("p50", "p95", "p99", "max"))
    total = SummaryRow("total", None, None, None, None, counts, lateness)
    note = "outcomes topic dp_outcomes does not exist"
    document = {
        "ok": promises_kept(counts),
        "isolation": {"header": "target topics read read_committed"},
        "as_of": "2026-01-01T00:00:00+00:00",
        "unmatched_deliveries": 0,
        "reschedules": {"note": note},
    }
    monkeypatch.setattr(job, "run", lambda *_, **__: job.AuditReport([total], document, {}))
    result = CliRunner().invoke(app, ["audit", "--out", str(tmp_path)])
    assert result.exit_code == 3, result.output
    assert f"note: {note}" in result.stdout
    assert "FAILED: 0 missing, 0 early, 1 superseded" in result.stderr
