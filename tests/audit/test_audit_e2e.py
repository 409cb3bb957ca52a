"""`delayservice audit` as a real process, on the real broker, after the real daemon ran.

The daemon, in precise mode beside its levels, delivers a known set of messages: level
messages, exact ones on the precise topic, one exact message cancelled before its due
time, and two rescheduled ones: one due in a minute moved twice (to 30 s, then to 1.5 s
after its second marker), one moved 1.5 s later. The audit of that run must pass, with
the exact messages under level `exact`, the cancelled one counted as cancelled, and each
moved one judged by the due time the daemon's reply to its last marker gave it (judged
by its own record, the first would be early). Then one missing delivery (a message
accepted on a delay topic while no daemon runs, so nothing ever forwards it), one
duplicated delivery (a forwarded record produced again, same headers) and one superseded
delivery (the twice-moved message again, carrying its first move's due time) are
planted, and the audit must name exactly those and exit non-zero.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from delayservice.audit.summary import COUNTS as ALL_COUNTS
from delayservice.markers.replies import parse_reply
from delayservice.producer import DelayProducer

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

GRACE = "1s"
DELAYS = [0.5, 1.0, 1.5, 2.0, 3.0]


def _audit(config: Path, out: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYSERVICE_")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "delayservice",
            "audit",
            "--config",
            str(config),
            "--grace",
            GRACE,
            "--out",
            str(out),
            "--conf",
            "spark.sql.shuffle.partitions=2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _config(settings, path: Path) -> Path:
    keys = (
        "bootstrap_servers",
        "levels",
        "topic_prefix",
        "dead_letter_topic",
        "group_id",
        "precise_topic",
        "markers_topic",
    )
    lines = [f'{k} = "{getattr(settings, k)}"\n' for k in keys]
    path.write_text("".join([*lines, f"precise = {str(settings.precise).lower()}\n"]))
    return path


def _verdicts(spark, out: Path) -> dict[str, set[str]]:
    rows = spark.read.parquet(str(out / "messages.parquet")).collect()
    flags = ("missing", "duplicated", "early", "superseded", "cancelled")
    return {flag: {r["id"] for r in rows if r[flag]} for flag in flags}


def _rows(spark, out: Path) -> dict[str, Any]:
    return {r["id"]: r for r in spark.read.parquet(str(out / "messages.parquet")).collect()}


class Landed:
    """Where each marker landed, from its delivery report: the key of its replies."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def __call__(self, err: Any, msg: Any) -> None:
        assert err is None, err
        self.keys.append(f"{msg.topic()}:{msg.partition()}:{msg.offset()}")


COUNTS = ALL_COUNTS[:8]  # all but `leaked` (level cancels: test_audit_level_markers)


def _judge_common(
    spark, out: Path, settings, targets: list[str], replies: dict[str, Any], moves: dict[str, str]
) -> None:
    """What holds of an audit before the planting and after it: the levels and the
    exact messages, each move judged by its last marker's reply, the targets, the plot."""
    summary = json.loads((out / "summary.json").read_text())
    assert [row["level"] for row in summary["by_level"]] == ["1s", "2s", "3s", "exact"]
    by_level = {row["level"]: row for row in summary["by_level"]}
    assert {k: by_level["exact"][k] for k in ("accepted", "delivered", "cancelled")} == {
        "accepted": 5,
        "delivered": 4,
        "cancelled": 1,
    }
    assert summary["precise_topic"] == settings.precise_topic
    assert summary["reschedules"] == {
        "outcomes_topics": sorted(
            [settings.markers_outcomes_topic, settings.precise_outcomes_topic]
        ),
        "messages_moved": 2,
        "note": None,
    }
    rows = _rows(spark, out)
    for mid, marker in moves.items():
        row = rows[mid]
        assert row["moved_by"] == marker  # the last marker's reply decided
        assert row["due_ms"] == row["moved_due_ms"] == replies[marker].due_ms
        assert row["due_ms"] == row["delivered_due_ms"]  # the daemon sent the copy it moved
        assert not row["early"]
    earlier_id, later_id = moves
    assert rows[earlier_id]["original_due_ms"] > rows[earlier_id]["due_ms"] + 25_000
    assert rows[later_id]["original_due_ms"] < rows[later_id]["due_ms"]
    assert not rows[later_id]["superseded"]
    assert sorted(row["target"] for row in summary["by_target"]) == sorted(targets)
    assert summary["total"]["lateness_ms"]["max"] >= 0
    assert (out / "lateness.png").stat().st_size > 0


@pytest.mark.parametrize(
    "clean_first",
    [
        pytest.param(True, marks=pytest.mark.long, id="clean-then-planted"),
        pytest.param(False, id="planted"),
    ],
)
def test_audit_passes_a_clean_run_and_names_each_planted_fault(
    testbed, spark, tmp_path, clean_first
):
    """CI runs one audit (a Spark job of its own, the slowest step of the suite), of the
    run with the faults planted: it must name exactly those and judge the rest as the
    clean run would. `--all` also audits the run before the planting, which must pass."""
    settings = testbed.settings(
        partitions=2,
        precise=True,
        precise_topic=f"dp-{testbed.tag}",
        precise_far_after="30s",  # the message sent for 60 s waits on the far topic
        data_dir=tmp_path / "data",
        precise_lookahead_s=2.0,
    )
    testbed.create_delay_topics(settings)
    targets = [
        testbed.create_topic(f"{name}-{testbed.tag}", partitions=2)
        for name in ("orders", "payments")
    ]
    daemon = testbed.start_daemon(settings)
    testbed.wait_assigned(daemon, partitions=settings.partitions)
    producer = testbed.producer(settings)
    sent = {
        producer.produce(
            targets[i % 2],
            f"v{i}".encode(),
            key=f"k{i}".encode(),
            headers=[("trace", str(i).encode())],
            delay=DELAYS[i % len(DELAYS)],
        ): i
        for i in range(30)
    }
    exact = DelayProducer(
        {"bootstrap.servers": testbed.bootstrap, "linger.ms": 0},
        settings=settings,
        precision="exact",
    )
    precise_ids = {exact.produce(targets[i], b"exact", delay=d) for i, d in enumerate((1.3, 2.7))}
    cancelled_id = exact.produce(targets[0], b"cancelled", delay=2)
    earlier_id = exact.produce(targets[0], b"moved earlier", delay=60)
    later_id = exact.produce(targets[1], b"moved later", delay=2.5)
    assert exact.flush(10) == 0
    exact.cancel(cancelled_id)
    earlier, later = Landed(), Landed()
    exact.reschedule(earlier_id, delay=30, on_delivery=earlier)
    exact.reschedule(earlier_id, delay=1.5, on_delivery=earlier)
    exact.reschedule(later_id, delay=4, on_delivery=later)
    assert exact.flush(10) == 0
    assert producer.flush(10) == 0
    sample = daemon.registry.get_sample_value
    testbed.wait_for(
        lambda: (
            sample("delayservice_precise_cancels_total", {"outcome": "cancelled"}) == 1
            and sample("delayservice_precise_reschedules_total", {"outcome": "moved"}) == 3
        ),
        10,
        "the daemon to call off the cancelled message and move the rescheduled ones",
    )
    delivered = testbed.collect(targets[0], 17) + testbed.collect(targets[1], 17)
    ids = {dict(r.headers())["delay-id"].decode() for r in delivered}
    assert ids == set(sent) | precise_ids | {earlier_id, later_id}
    # One reply per marker (one daemon holds every partition): the cancel's and three moves.
    replies = {
        r.key().decode(): parse_reply(r.value())
        for r in testbed.collect(settings.precise_outcomes_topic, 4)
    }
    assert {k: (v.message_id, v.outcome) for k, v in replies.items() if v.kind == "reschedule"} == {
        earlier.keys[0]: (earlier_id, "moved"),
        earlier.keys[1]: (earlier_id, "moved"),
        later.keys[0]: (later_id, "moved"),
    }
    daemon.stop()
    config = _config(settings, tmp_path / "audit.toml")

    moves = {earlier_id: earlier.keys[1], later_id: later.keys[0]}  # each one's last marker
    if clean_first:
        clean = _audit(config, tmp_path / "clean")
        assert clean.returncode == 0, clean.stdout + clean.stderr
        summary = json.loads((tmp_path / "clean" / "summary.json").read_text())
        assert summary["ok"] is True
        assert {k: summary["total"][k] for k in COUNTS} == {
            "accepted": 35,
            "delivered": 34,
            "missing": 0,
            "duplicated": 0,
            "early": 0,
            "superseded": 0,
            "cancelled": 1,
            "pending": 0,
        }
        _judge_common(spark, tmp_path / "clean", settings, targets, replies, moves)
        rows = _rows(spark, tmp_path / "clean")
        assert (rows[earlier_id]["early"], rows[earlier_id]["superseded"]) == (False, False)

    # Plant a duplicate: a forwarded level record, produced again with the same headers.
    copy = next(r for r in delivered if dict(r.headers())["delay-id"].decode() in sent)
    duplicated_id = dict(copy.headers())["delay-id"].decode()
    plain = Producer({"bootstrap.servers": testbed.bootstrap})
    plain.produce(copy.topic(), copy.value(), copy.key(), headers=copy.headers())
    # Plant a superseded delivery: the twice-moved message, sent at its first move's time.
    moved = next(r for r in delivered if dict(r.headers())["delay-id"].decode() == earlier_id)
    replaced_due = str(replies[earlier.keys[0]].due_ms).encode()
    stale = [(k, replaced_due if k == "delay-due-ms" else v) for k, v in moved.headers()]
    plain.produce(moved.topic(), moved.value(), moved.key(), headers=stale)
    # Plant a missing delivery: accepted on level 1s while no daemon runs to forward it.
    appended: list[int] = []
    late = testbed.producer(settings)
    missing_id = late.produce(
        targets[0],
        b"lost",
        delay=1,
        on_delivery=lambda err, msg: appended.append(msg.timestamp()[1]),
    )
    assert plain.flush(10) == 0
    assert late.flush(10) == 0
    overdue_at_ms = appended[0] + 1000 + 1000  # due (append + level 1s) plus the grace
    testbed.wait_for(
        lambda: time.time() * 1000 > overdue_at_ms, 10, "the planted record to be overdue"
    )

    planted = _audit(config, tmp_path / "planted")
    assert planted.returncode == 3, planted.stdout + planted.stderr
    assert "FAILED: 1 missing, 0 early, 1 superseded" in planted.stderr
    summary = json.loads((tmp_path / "planted" / "summary.json").read_text())
    assert summary["ok"] is False
    assert {k: summary["total"][k] for k in COUNTS[:6]} == {
        "accepted": 36,
        "delivered": 34,
        "missing": 1,
        "duplicated": 2,
        "early": 0,
        "superseded": 1,
    }
    level_1s = next(row for row in summary["by_level"] if row["level"] == "1s")
    assert level_1s["missing"] == 1
    _judge_common(spark, tmp_path / "planted", settings, targets, replies, moves)
    assert _verdicts(spark, tmp_path / "planted") == {
        "missing": {missing_id},
        "duplicated": {duplicated_id, earlier_id},
        "early": set(),
        "superseded": {earlier_id},
        "cancelled": {cancelled_id},
    }
