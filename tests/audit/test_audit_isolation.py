"""Which isolation level each side of the audit is read at, without a broker or Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from delayservice.audit import extract, jars, job
from delayservice.audit.isolation import (
    DEFAULT,
    Isolation,
    IsolationOptionError,
    header,
    of_daemon,
    refuse_explicit,
)
from delayservice.audit.summary import collect_summary
from delayservice.cli.app import app
from delayservice.errors import ConfigError
from delayservice.settings_loading import load_settings


def test_the_default_is_read_committed() -> None:
    assert DEFAULT is Isolation.READ_COMMITTED


def test_the_delay_topics_are_read_as_the_daemons_consumer_reads_them() -> None:
    assert of_daemon(load_settings(bootstrap_servers="b:9092")) is Isolation.READ_COMMITTED
    same = load_settings(bootstrap_servers="b:9092", consumer={"isolation.level": "read_committed"})
    assert of_daemon(same) is Isolation.READ_COMMITTED


@pytest.mark.parametrize("setting", ["consumer", "kafka"])
@pytest.mark.parametrize("value", ["read_uncommitted", "dirty"])
def test_the_daemon_reads_nothing_but_read_committed(setting: str, value: str) -> None:
    """Its settings refuse any other isolation level (`client_keys`)."""
    with pytest.raises(ConfigError, match=rf"{setting}: isolation\.level = '{value}'"):
        load_settings(bootstrap_servers="b:9092", **{setting: {"isolation.level": value}})


def test_an_explicit_isolation_option_is_refused_for_the_audit_sets_it_per_side() -> None:
    refuse_explicit({"kafka.client.id": "a"})
    for key in ("isolation.level", "kafka.isolation.level"):
        with pytest.raises(IsolationOptionError, match="--isolation"):
            refuse_explicit({key: "read_uncommitted"})


def test_the_header_names_both_sides() -> None:
    line = header(Isolation.READ_UNCOMMITTED, Isolation.READ_COMMITTED)
    assert line.startswith("target topics read read_uncommitted (every record, aborted")
    assert line.endswith("delay topics read read_committed, as the daemon reads them")


class Reader:
    def __init__(self) -> None:
        self.options: dict[str, str] = {}

    def format(self, _: str) -> Reader:
        return self

    def option(self, key: str, value: str) -> Reader:
        self.options[key] = value
        return self

    def load(self) -> str:
        return "frame"


class Spark:
    def __init__(self) -> None:
        self.read = Reader()


@pytest.mark.parametrize("isolation", list(Isolation))
def test_sparks_kafka_source_gets_the_sides_isolation_over_any_other(isolation: Isolation) -> None:
    spark = Spark()
    ranges = {"t": {0: (0, 5)}}
    given = {"kafka.isolation.level": "other", "client.id": "c"}
    assert extract.read_kafka(spark, "b:9092", ranges, given, isolation) == "frame"  # type: ignore[arg-type]
    assert spark.read.options["kafka.isolation.level"] == isolation.value
    assert spark.read.options["kafka.client.id"] == "c"


@pytest.mark.parametrize("isolation", list(Isolation))
def test_the_pinned_ranges_end_where_a_reader_at_that_level_stops(
    monkeypatch: pytest.MonkeyPatch, isolation: Isolation
) -> None:
    """read_committed's `latest` is the last stable offset, which only a read_committed
    consumer's offset lookups return."""
    configs: list[dict[str, Any]] = []

    class Consumer:
        def __init__(self, config: dict[str, Any]) -> None:
            configs.append(config)

    monkeypatch.setattr(extract, "Consumer", Consumer)
    extract.OffsetResolver(load_settings(bootstrap_servers="b:9092"), isolation)
    assert configs[0]["isolation.level"] == isolation.value


class _NoRows:
    def collect(self) -> list[Any]:
        return []


def _report(isolation: Isolation) -> job.AuditReport:
    rows = collect_summary(_NoRows())  # type: ignore[arg-type]  # only collect() is used
    document = {
        "ok": True,
        "as_of": "2026-01-01T00:00:00+00:00",
        "unmatched_deliveries": 0,
        "isolation": {"header": header(isolation, Isolation.READ_COMMITTED)},
        "reschedules": {"note": None},
    }
    return job.AuditReport(rows, document, {})


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ([], {}, Isolation.READ_COMMITTED),
        (["--isolation", "read_uncommitted"], {}, Isolation.READ_UNCOMMITTED),
        ([], {"DELAYSERVICE_AUDIT_ISOLATION": "read_uncommitted"}, Isolation.READ_UNCOMMITTED),
    ],
)
def test_the_option_reaches_the_job_and_heads_the_report(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    args: list[str],
    env: dict[str, str],
    expected: Isolation,
) -> None:
    seen: list[job.AuditOptions] = []

    def run(_: Any, options: job.AuditOptions, *__: Any, **___: Any) -> job.AuditReport:
        seen.append(options)
        return _report(options.isolation)

    monkeypatch.setattr(job, "run", run)
    result = CliRunner().invoke(
        app, ["audit", "-b", "b:9092", "--out", str(tmp_path), *args], env=env
    )
    assert result.exit_code == 0, result.output
    assert seen[0].isolation is expected
    assert result.stdout.splitlines()[0].startswith(f"target topics read {expected.value} (")


def test_an_unknown_isolation_level_exits_2() -> None:
    result = CliRunner().invoke(app, ["audit", "-b", "b:9092", "--isolation", "dirty"])
    assert result.exit_code == 2
    assert "read_committed" in result.output


def test_an_explicit_isolation_kafka_option_exits_2_before_spark_is_prepared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(jars, "connector_jars", lambda *_: pytest.fail("Spark was prepared"))
    result = CliRunner().invoke(
        app, ["audit", "-b", "b:9092", "--kafka-option", "isolation.level=read_uncommitted"]
    )
    assert result.exit_code == 2, result.output
    assert "use --isolation" in result.output
