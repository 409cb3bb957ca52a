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

Precise mode, a second story on the same levels plus the precise topic `dp` (level
`exact`, due = max(append + delay-ms, delay-due-ms), no level delay):
  p1  delay-ms 1300, delivered 5 ms late
  p2  delay-ms 0 with delay-due-ms 2.5 s after append: the later due wins
  p3  delay-ms 1000 with an earlier delay-due-ms, delivered before append + 1 s (early)
  p4  cancel marker on its partition before due, never delivered      (cancelled)
  p5  cancel marker after due, never delivered: honoured late         (cancelled)
  p6  cancel marker after due, delivered                              (delivered)
  p7  cancel markers before due, but on another partition and on a level topic,
      where its holder does not read them; never delivered           (missing)
  p8  cancel marker before the message, delivered anyway             (delivered, cancelled)
  p9  due after as_of - grace                                         (pending)
  l1  level 1s; a cancel marker on the precise topic cannot call it off (missing)
  l2  level 1s with delay-due-ms 1.8 s after append, delivered at 1.5 s (early)
  l3  level 1s with delay-ms 1500 (held past the level), delivered at 1.2 s (early)
  l4  level 2s with an earlier delay-due-ms, delivered at append + 2 s (on time)
noise: a precise record whose delay-due-ms is not a number (the daemon dead-letters it).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from delayservice.audit import load, transform
from delayservice.audit.extract import kafka_schema
from delayservice.audit.summary import collect_summary, lateness_histogram, summarize
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


def no_moves(spark):
    """What the outcomes topics say when nothing was rescheduled."""
    return transform.moves(frame(spark, []), [PRECISE])


@pytest.fixture(scope="module")
def messages(sides, spark):
    delay, target = sides
    accepted = transform.accepted(delay, LEVELS)
    return transform.reconcile(
        accepted,
        transform.cancels(delay),
        transform.deliveries(target),
        no_moves(spark),
        as_of_ms=AS_OF,
        grace_ms=GRACE,
    ).cache()


@pytest.fixture(scope="module")
def summary(messages):
    return {(r.scope, r.level, r.target): r for r in collect_summary(summarize(messages))}


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
        "superseded": 0,
        "cancelled": 1,
        "pending": 1,
        "leaked": 0,
    }
    assert counts["2s"] == {
        "accepted": 5,
        "delivered": 5,
        "missing": 0,
        "duplicated": 0,
        "early": 0,
        "superseded": 0,
        "cancelled": 0,
        "pending": 0,
        "leaked": 0,
    }
    assert counts["3s"] == {
        "accepted": 1,
        "delivered": 1,
        "missing": 0,
        "duplicated": 0,
        "early": 0,
        "superseded": 0,
        "cancelled": 0,
        "pending": 0,
        "leaked": 0,
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
        "superseded": 0,
        "cancelled": 1,
        "pending": 1,
        "leaked": 0,
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
        no_moves(spark),
        as_of_ms=AS_OF,
        grace_ms=GRACE,
    )
    (total,) = collect_summary(summarize(messages))
    assert total.scope == "total"
    assert total.counts["accepted"] == 0
    assert lateness_histogram(messages) == (1, [])
    assert load.plot_lateness((1, []), [total], tmp_path).stat().st_size > 0


def test_histogram_bins_cover_every_delivered_message(messages):
    width, bins = lateness_histogram(messages, bins=10)
    assert width == 200  # (1000 - -5) / 10 rounded up to a 1-2-5 step
    assert sum(count for *_, count in bins) == 9
    assert {(level, start) for _, level, start, _ in bins} >= {("1s", -200), ("3s", 1000)}


def test_outputs_parquet_json_png_and_table(messages, summary, spark, tmp_path):
    rows = collect_summary(summarize(messages))
    parquet = load.write_messages(messages, tmp_path)
    assert spark.read.parquet(str(parquet)).count() == 13
    plot = load.plot_lateness(lateness_histogram(messages), rows, tmp_path)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    path = load.write_summary({"total": rows[-1].as_dict()}, tmp_path)
    assert json.loads(path.read_text())["total"]["missing"] == 2
    table = load.console_table(rows).splitlines()
    assert table[0].split()[:3] == ["ACCEPTED", "DELIVERED", "MISSING"]
    assert [line.split()[0] for line in table[2:5]] == ["1s", "2s", "3s"]
    assert table[-1].split()[:4] == ["total", "13", "9", "2"]


PRECISE = "dp"


def precise_envelope(
    mid: str, target: str, delay_ms: int, due_ms: int | None = None
) -> dict[str, str]:
    headers = envelope(mid, target, delay_ms)
    return headers if due_ms is None else {**headers, "delay-due-ms": str(due_ms)}


@pytest.fixture(scope="module")
def precise_sides(spark):
    def exact(ms, mid, delay_ms, due_ms=None, partition=0):
        headers = precise_envelope(mid, "orders", delay_ms, due_ms)
        return record(PRECISE, ms, headers, partition=partition)

    def cancel(topic, ms, mid, partition=0):
        return record(topic, ms, {"delay-v": "1", "delay-cancel": mid}, partition=partition)

    delay = [
        exact(T0, "p1", 1300),
        exact(T0 + 10, "p2", 0, due_ms=T0 + 2500),
        exact(T0, "p3", 1000, due_ms=T0 + 200),
        exact(T0, "p4", 3000, partition=1),
        cancel(PRECISE, T0 + 1000, "p4", partition=1),
        exact(T0, "p5", 1000),
        cancel(PRECISE, T0 + 1500, "p5"),
        exact(T0, "p6", 1000),
        cancel(PRECISE, T0 + 1500, "p6"),
        exact(T0, "p7", 1000),
        cancel(PRECISE, T0 + 100, "p7", partition=1),
        cancel("dt_1", T0 + 100, "p7"),
        cancel(PRECISE, T0, "p8", partition=1),
        exact(T0 + 5, "p8", 1000, partition=1),
        exact(T0 + 55_000, "p9", 1000),
        record(PRECISE, T0, {**envelope("bad", "orders", 1000), "delay-due-ms": "soon"}),
        record("dt_1", T0, envelope("l1", "orders", 1000)),
        cancel(PRECISE, T0 + 100, "l1"),
        record("dt_1", T0, precise_envelope("l2", "orders", 1000, due_ms=T0 + 1800)),
        record("dt_1", T0, envelope("l3", "orders", 1500)),
        record("dt_2", T0, precise_envelope("l4", "payments", 2000, due_ms=T0 + 500)),
    ]
    target = [
        record("orders", T0 + 1305, forwarded("p1", T0 + 1300)),
        record("orders", T0 + 2502, forwarded("p2", T0 + 2500)),
        record("orders", T0 + 600, forwarded("p3", T0 + 600)),
        record("orders", T0 + 1010, forwarded("p6", T0 + 1000)),
        record("orders", T0 + 1007, forwarded("p8", T0 + 1005)),
        record("orders", T0 + 1500, forwarded("l2", T0 + 1800)),
        record("orders", T0 + 1200, forwarded("l3", T0 + 1500)),
        record("payments", T0 + 2000, forwarded("l4", T0 + 2000)),
    ]
    return frame(spark, delay), frame(spark, target)


def _precise_messages(spark, sides, precise_topics):
    delay, target = sides
    return transform.reconcile(
        transform.accepted(delay, LEVELS, precise_topics=precise_topics),
        transform.cancels(delay, precise_topics),
        transform.deliveries(target),
        no_moves(spark),
        as_of_ms=AS_OF,
        grace_ms=GRACE,
    )


@pytest.fixture(scope="module")
def precise_messages(spark, precise_sides):
    return _precise_messages(spark, precise_sides, [PRECISE]).cache()


@pytest.fixture(scope="module")
def precise_by_id(precise_messages):
    return {r["id"]: r for r in precise_messages.collect()}


def test_precise_due_is_append_plus_delay_ms_or_the_later_delay_due_ms(precise_by_id):
    p1, p2, p3 = (precise_by_id[i] for i in ("p1", "p2", "p3"))
    assert (p1["level"], p1["level_delay_ms"], p1["level_index"]) == ("exact", None, 4)
    assert p1["due_ms"] == T0 + 1300  # not rounded up to a level
    assert (p1["status"], p1["lateness_ms"], p1["early"]) == ("delivered", 5, False)
    assert p2["requested_due_ms"] == T0 + 2500
    assert p2["due_ms"] == T0 + 2500  # deliver_at: the absolute due time is later, it wins
    assert (p2["lateness_ms"], p2["early"]) == (2, False)
    assert p3["due_ms"] == T0 + 1000  # an earlier delay-due-ms does not make it due sooner
    assert (p3["lateness_ms"], p3["early"]) == (-400, True)
    assert "bad" not in precise_by_id


def test_precise_cancels_count_before_due_on_the_messages_own_partition(precise_by_id):
    status = {i: precise_by_id[i]["status"] for i in ("p4", "p5", "p6", "p7", "p8", "p9")}
    assert status == {
        "p4": "cancelled",
        "p5": "cancelled",  # after due, but the daemon had not sent it yet: honoured
        "p6": "delivered",
        "p7": "missing",  # markers its holder never reads do not count
        "p8": "delivered",
        "p9": "pending",
    }
    assert precise_by_id["p4"]["cancel_ms"] == T0 + 1000
    assert not precise_by_id["p4"]["missing"]
    assert precise_by_id["p5"]["cancelled"]
    assert not precise_by_id["p5"]["missing"]
    assert not precise_by_id["p6"]["cancelled"]
    assert precise_by_id["p7"]["cancel_ms"] is None
    # Cancelled in time and delivered anyway: shown as both, not hidden as cancelled.
    p8 = precise_by_id["p8"]
    assert (p8["delivered"], p8["cancelled"], p8["cancel_ms"]) == (True, True, T0)


def test_level_due_honours_delay_ms_and_delay_due_ms_as_floors(precise_by_id):
    l1, l2, l3, l4 = (precise_by_id[i] for i in ("l1", "l2", "l3", "l4"))
    assert (l1["status"], l1["cancel_ms"]) == ("missing", None)  # precise cancels: exact only
    assert (l2["level"], l2["due_ms"], l2["early"], l2["lateness_ms"]) == (
        "1s",
        T0 + 1800,
        True,
        -300,
    )
    assert (l3["level_delay_ms"], l3["due_ms"], l3["early"]) == (1000, T0 + 1500, True)
    assert (l4["due_ms"], l4["early"], l4["lateness_ms"]) == (T0 + 2000, False, 0)


def test_precise_mode_off_accepts_only_the_levels(spark, precise_sides):
    ids = {r["id"] for r in _precise_messages(spark, precise_sides, []).collect()}
    assert ids == {"l1", "l2", "l3", "l4"}


def test_exact_is_a_level_in_the_summary_table_json_and_plot(precise_messages, tmp_path):
    rows = collect_summary(summarize(precise_messages))
    by_level = {r.level: r for r in rows if r.scope == "level"}
    assert list(by_level) == ["1s", "2s", "exact"]
    exact = by_level["exact"]
    assert exact.counts == {
        "accepted": 9,
        "delivered": 5,
        "missing": 1,
        "duplicated": 0,
        "early": 1,
        "superseded": 0,
        "cancelled": 3,
        "pending": 1,
        "leaked": 0,
    }
    assert exact.lateness_ms["max"] == 10.0
    assert exact.as_dict()["level_delay_ms"] is None
    assert by_level["1s"].counts["early"] == 2
    total = next(r for r in rows if r.scope == "total")
    assert (total.counts["accepted"], total.counts["early"]) == (13, 3)
    table = load.console_table(rows).splitlines()
    assert [line.split()[0] for line in table[2:5]] == ["1s", "2s", "exact"]
    assert table[4].split()[1:9] == ["9", "5", "1", "0", "1", "0", "3", "1"]
    histogram = lateness_histogram(precise_messages)
    assert {level for _, level, _, _ in histogram[1]} == {"1s", "2s", "exact"}
    plot = load.plot_lateness(histogram, rows, tmp_path)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("lead_ms", "leaked"), [(0, {"c1", "c2"}), (1000, {"c1"})])
def test_a_level_cancel_within_the_lead_may_lose_the_race_without_failing_the_audit(
    spark, lead_ms, leaked
):
    """`cancel_lead`: a level cancel acknowledged at least the lead before the due time
    is promised, so its message delivered anyway is leaked; one inside the lead is
    promised only when read first, and stays visible as cancelled and delivered."""
    delay = [
        record("dt_1", T0, envelope("c1", "orders", 1000)),
        record("dt_1", T0 - 500, {"delay-v": "1", "delay-cancel": "c1"}),  # 1.5 s before due
        record("dt_1", T0, envelope("c2", "orders", 1000)),
        record("dt_1", T0 + 700, {"delay-v": "1", "delay-cancel": "c2"}),  # 0.3 s before due
    ]
    target = [
        record("orders", T0 + 1005, forwarded("c1", T0 + 1000)),
        record("orders", T0 + 1005, forwarded("c2", T0 + 1000)),
    ]
    delay_frame, target_frame = frame(spark, delay), frame(spark, target)
    rows = transform.reconcile(
        transform.accepted(delay_frame, LEVELS),
        transform.cancels(delay_frame),
        transform.deliveries(target_frame),
        no_moves(spark),
        as_of_ms=AS_OF,
        grace_ms=GRACE,
        cancel_lead_ms=lead_ms,
    ).collect()
    assert {r["id"] for r in rows if r["leaked"]} == leaked
    assert {r["id"] for r in rows if r["cancelled"] and r["delivered"]} == {"c1", "c2"}
