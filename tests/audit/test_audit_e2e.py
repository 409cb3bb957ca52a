"""`delayservice audit` as a real process, on the real broker, after the real daemon ran.

The daemon, in precise mode beside its levels, delivers a known set of messages: level
messages, exact ones on the precise topic, and one exact message cancelled before its
due time. The audit of that run must pass, with the exact messages under level `exact`
and the cancelled one counted as cancelled. Then one missing delivery (a message
accepted on a delay topic while no daemon runs, so nothing ever forwards it) and one
duplicated delivery (a forwarded record produced again, same headers) are planted, and
the audit must name exactly those two and exit non-zero.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

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
    )
    lines = [f'{k} = "{getattr(settings, k)}"\n' for k in keys]
    path.write_text("".join([*lines, f"precise = {str(settings.precise).lower()}\n"]))
    return path


def _verdicts(spark, out: Path) -> dict[str, set[str]]:
    rows = spark.read.parquet(str(out / "messages.parquet")).collect()
    flags = ("missing", "duplicated", "early", "cancelled")
    return {flag: {r["id"] for r in rows if r[flag]} for flag in flags}


def test_audit_passes_a_clean_run_and_names_each_planted_fault(testbed, spark, tmp_path):
    settings = testbed.settings(
        partitions=2,
        precise=True,
        precise_topic=f"dp-{testbed.tag}",
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
    assert exact.flush(10) == 0
    exact.cancel(cancelled_id)
    assert exact.flush(10) == 0
    assert producer.flush(10) == 0
    cancels = {"outcome": "cancelled"}
    testbed.wait_for(
        lambda: (
            daemon.registry.get_sample_value("delayservice_precise_cancels_total", cancels) == 1
        ),
        10,
        "the daemon to call off the cancelled message",
    )
    delivered = testbed.collect(targets[0], 16) + testbed.collect(targets[1], 16)
    ids = {dict(r.headers())["delay-id"].decode() for r in delivered}
    assert ids == set(sent) | precise_ids
    daemon.stop()
    config = _config(settings, tmp_path / "audit.toml")

    clean = _audit(config, tmp_path / "clean")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    summary = json.loads((tmp_path / "clean" / "summary.json").read_text())
    assert summary["ok"] is True
    assert {
        k: summary["total"][k]
        for k in ("accepted", "delivered", "missing", "duplicated", "early", "cancelled", "pending")
    } == {
        "accepted": 33,
        "delivered": 32,
        "missing": 0,
        "duplicated": 0,
        "early": 0,
        "cancelled": 1,
        "pending": 0,
    }
    assert [row["level"] for row in summary["by_level"]] == ["1s", "2s", "3s", "exact"]
    by_level = {row["level"]: row for row in summary["by_level"]}
    assert {k: by_level["exact"][k] for k in ("accepted", "delivered", "cancelled")} == {
        "accepted": 3,
        "delivered": 2,
        "cancelled": 1,
    }
    assert summary["precise_topic"] == settings.precise_topic
    assert sorted(row["target"] for row in summary["by_target"]) == sorted(targets)
    assert summary["total"]["lateness_ms"]["max"] >= 0
    assert (tmp_path / "clean" / "lateness.png").stat().st_size > 0

    # Plant a duplicate: the first forwarded record, produced again with the same headers.
    copy = delivered[0]
    duplicated_id = dict(copy.headers())["delay-id"].decode()
    plain = Producer({"bootstrap.servers": testbed.bootstrap})
    plain.produce(copy.topic(), copy.value(), copy.key(), headers=copy.headers())
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
    assert "FAILED: 1 missing, 0 early" in planted.stderr
    summary = json.loads((tmp_path / "planted" / "summary.json").read_text())
    assert summary["ok"] is False
    assert {
        k: summary["total"][k] for k in ("accepted", "delivered", "missing", "duplicated", "early")
    } == {"accepted": 34, "delivered": 32, "missing": 1, "duplicated": 1, "early": 0}
    level_1s = next(row for row in summary["by_level"] if row["level"] == "1s")
    assert level_1s["missing"] == 1
    assert _verdicts(spark, tmp_path / "planted") == {
        "missing": {missing_id},
        "duplicated": {duplicated_id},
        "early": set(),
        "cancelled": {cancelled_id},
    }
