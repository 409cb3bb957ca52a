"""The audit's transform on hand-made rows: every count and percentile is known in advance.

Levels 1s, 2s and 3s. The audit is "as of" T0 + 60 s with a 10 s grace period, so a
message due before T0 + 50 s and not delivered is missing, one due later is pending.

level 1s -> orders
  m1  delivered 10 ms late
  m2  delivered 20 ms late, then a second copy 500 ms later      (duplicated)
  m3  delivered 5 ms before due                                  (early)
  m4  never delivered                                            (missing)
  m5  never delivered, cancel marker before due                  (cancelled)
  m6  never delivered, cancel marker after due: too late         (missing)
  m7  never delivered, due after as_of - grace                   (pending)
level 2s -> payments
  m8..m12 delivered 0, 100, 200, 300, 400 ms late; m12 accepted twice (producer retry)
level 3s -> orders
  m13 delivered 1000 ms late
noise: a record without envelope, one with envelope version 2, a target record without
delay-id, and one delivery of an id nobody accepted (unmatched).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from delayservice.audit import load, transform
from delayservice.audit.extract import kafka_schema
from delayservice.levels import LevelSet

pytestmark = pytest.mark.spark

T0 = 1_700_000_000_000
AS_OF = T0 + 60_000
GRACE = 10_000
LEVELS = LevelSet.parse("1s,2s,3s", "dt_")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def record(
    topic: str, ms: int, headers: dict[str, str] | None = None, *, partition: int = 0
) -> tuple[Any, ...]:
    """One row in the schema of Spark's Kafka source (with includeHeaders), exact to the ms."""
    pairs = [(k, v.encode()) for k, v in (headers or {}).items()]
    return (None, b"payload", topic, partition, 0, EPOCH + timedelta(milliseconds=ms), 1, pairs)


def frame(spark, rows):
    return spark.createDataFrame(rows, kafka_schema())


def envelope(mid: str, target: str, delay_ms: int, version: str = "1") -> dict[str, str]:
    return {"delay-v": version, "delay-target": target, "delay-ms": str(delay_ms), "delay-id": mid}


def forwarded(mid: str, due_ms: int) -> dict[str, str]:
    return {"trace": "x", "delay-id": mid, "delay-due-ms": str(due_ms)}


@pytest.fixture(scope="module")
def sides(spark):
    delay = [
        record("dt_1", T0, envelope("m1", "orders", 800)),
        record("dt_1", T0, envelope("m2", "orders", 1000)),
        record("dt_1", T0 + 100, envelope("m3", "orders", 1000)),
        record("dt_1", T0, envelope("m4", "orders", 1000)),
        record("dt_1", T0, envelope("m5", "orders", 1000)),
        record("dt_1", T0 + 500, {"delay-cancel": "m5"}),
        record("dt_1", T0, envelope("m6", "orders", 1000)),
        record("dt_1", T0 + 2000, {"delay-cancel": "m6"}),
        record("dt_1", T0 + 50_000, envelope("m7", "orders", 1000)),
        record("dt_1", T0, {"unrelated": "no envelope"}),
        record("dt_1", T0, envelope("v2", "orders", 1000, version="2")),
        record("dt_1", T0, {**envelope("bad", "orders", 1000), "delay-ms": "soon"}),
        *[record("dt_2", T0 + i, envelope(f"m{8 + i}", "payments", 2000)) for i in range(5)],
        record("dt_2", T0 + 700, envelope("m12", "payments", 2000)),  # the same id again
        record("dt_3", T0, envelope("m13", "orders", 2500)),
    ]
    target = [
        record("orders", T0 + 1010, forwarded("m1", T0 + 1000)),
        record("orders", T0 + 1020, forwarded("m2", T0 + 1000)),
        record("orders", T0 + 1520, forwarded("m2", T0 + 1000), partition=1),
        record("orders", T0 + 1095, forwarded("m3", T0 + 1100)),
        record("orders", T0 + 4000, forwarded("m13", T0 + 3000)),
        record("orders", T0 + 1000, {"plain": "not delayed"}),
        record("orders", T0 + 5000, forwarded("stranger", T0 + 5000)),
        *[
            record("payments", T0 + i + 2000 + 100 * i, forwarded(f"m{8 + i}", T0 + i + 2000))
            for i in range(5)
        ],
    ]
    return frame(spark, delay), frame(spark, target)


@pytest.fixture(scope="module")
def messages(sides):
    delay, target = sides
    accepted = transform.accepted(delay, LEVELS)
    return transform.reconcile(
        accepted,
        transform.cancels(delay),
        transform.deliveries(target),
        as_of_ms=AS_OF,
        grace_ms=GRACE,
    ).cache()


@pytest.fixture(scope="module")
def summary(messages):
    return {
        (r.scope, r.level, r.target): r
        for r in transform.collect_summary(transform.summarize(messages))
    }


def test_each_message_gets_the_verdict_its_story_calls_for(messages):
    by_id = {r["id"]: r for r in messages.collect()}
    assert sorted(by_id) == sorted(f"m{i}" for i in range(1, 14))
    assert {i: by_id[i]["status"] for i in by_id} == {
        "m1": "delivered",
        "m2": "delivered",
        "m3": "delivered",
        "m4": "missing",
        "m5": "cancelled",
        "m6": "missing",
        "m7": "pending",
        "m8": "delivered",
        "m9": "delivered",
        "m10": "delivered",
        "m11": "delivered",
        "m12": "delivered",
        "m13": "delivered",
    }
    assert by_id["m2"]["deliveries"] == 2
    assert by_id["m2"]["duplicated"]
    assert by_id["m2"]["lateness_ms"] == 20  # judged by the first copy
    assert by_id["m3"]["early"]
    assert by_id["m3"]["lateness_ms"] == -5
    assert by_id["m12"]["accepted_copies"] == 2
    assert by_id["m12"]["append_ms"] == T0 + 4  # the first acceptance counts
    assert by_id["m13"]["level"] == "3s"
    assert by_id["m13"]["due_ms"] == T0 + 3000  # append time + level delay, not the requested 2.5 s
    assert by_id["m1"]["delay_ms"] == 800
    assert by_id["m1"]["delivered_due_ms"] == T0 + 1000
    assert by_id["m1"]["delivered_topic"] == "orders"


def test_counts_per_level(summary):
    counts = {level: summary["level", level, None].counts for level in ("1s", "2s", "3s")}
    assert counts["1s"] == {
        "accepted": 7,
        "delivered": 3,
        "missing": 2,
        "duplicated": 1,
        "early": 1,
        "cancelled": 1,
        "pending": 1,
    }
    assert counts["2s"] == {
        "accepted": 5,
        "delivered": 5,
        "missing": 0,
        "duplicated": 0,
        "early": 0,
        "cancelled": 0,
        "pending": 0,
    }
    assert counts["3s"] == {
        "accepted": 1,
        "delivered": 1,
        "missing": 0,
        "duplicated": 0,
        "early": 0,
        "cancelled": 0,
        "pending": 0,
    }


def test_counts_per_target_and_in_total(summary):
    assert summary["target", None, "orders"].counts["accepted"] == 8
    assert summary["target", None, "orders"].counts["missing"] == 2
    assert summary["target", None, "payments"].counts["delivered"] == 5
    assert summary["level+target", "3s", "orders"].counts["delivered"] == 1
    assert summary["total", None, None].counts == {
        "accepted": 13,
        "delivered": 9,
        "missing": 2,
        "duplicated": 1,
        "early": 1,
        "cancelled": 1,
        "pending": 1,
    }


def test_lateness_percentiles_are_exact(summary):
    # Linear interpolation between closest ranks, as numpy.percentile does by default.
    assert summary["level", "1s", None].lateness_ms == {
        "p50": 10.0,
        "p95": 19.0,
        "p99": 19.8,
        "max": 20.0,
    }
    assert summary["level", "2s", None].lateness_ms == {
        "p50": 200.0,
        "p95": 380.0,
        "p99": 396.0,
        "max": 400.0,
    }
    assert summary["level", "3s", None].lateness_ms == {
        "p50": 1000.0,
        "p95": 1000.0,
        "p99": 1000.0,
        "max": 1000.0,
    }
    total = summary["total", None, None].lateness_ms
    assert total["p50"] == 100.0
    assert total["p95"] == pytest.approx(760.0)
    assert total["p99"] == pytest.approx(952.0)
    assert total["max"] == 1000.0


def test_targets_deliveries_without_acceptance_and_noise(sides, spark):
    delay, target = sides
    assert transform.target_topics(delay) == ["orders", "payments"]
    assert transform.accepted(delay, LEVELS, ["payments"]).count() == 5
    assert transform.unmatched(transform.deliveries(target), transform.accepted(delay, LEVELS)) == 1


def test_no_input_still_gives_a_total_and_a_plot(spark, tmp_path):
    empty = frame(spark, [])
    messages = transform.reconcile(
        transform.accepted(empty, LEVELS),
        transform.cancels(empty),
        transform.deliveries(empty),
        as_of_ms=AS_OF,
        grace_ms=GRACE,
    )
    (total,) = transform.collect_summary(transform.summarize(messages))
    assert total.scope == "total"
    assert total.counts["accepted"] == 0
    assert transform.lateness_histogram(messages) == (1, [])
    assert load.plot_lateness((1, []), [total], tmp_path).stat().st_size > 0


def test_histogram_bins_cover_every_delivered_message(messages):
    width, bins = transform.lateness_histogram(messages, bins=10)
    assert width == 200  # (1000 - -5) / 10 rounded up to a 1-2-5 step
    assert sum(count for *_, count in bins) == 9
    assert {(level, start) for _, level, start, _ in bins} >= {("1s", -200), ("3s", 1000)}


def test_outputs_parquet_json_png_and_table(messages, summary, spark, tmp_path):
    rows = transform.collect_summary(transform.summarize(messages))
    parquet = load.write_messages(messages, tmp_path)
    assert spark.read.parquet(str(parquet)).count() == 13
    plot = load.plot_lateness(transform.lateness_histogram(messages), rows, tmp_path)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    path = load.write_summary({"total": rows[-1].as_dict()}, tmp_path)
    assert json.loads(path.read_text())["total"]["missing"] == 2
    table = load.console_table(rows).splitlines()
    assert table[0].split()[:3] == ["ACCEPTED", "DELIVERED", "MISSING"]
    assert [line.split()[0] for line in table[2:5]] == ["1s", "2s", "3s"]
    assert table[-1].split()[:4] == ["total", "13", "9", "2"]
