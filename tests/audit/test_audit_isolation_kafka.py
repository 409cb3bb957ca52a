"""`delayservice audit --isolation` on the real broker: duplicates are what that reader sees.

The daemon forwards six messages. Then Kafka transactions leave on the target topic what
an exactly-once forwarder can leave there: an aborted copy of one forward, a committed
copy of another (a real duplicate for any reader), and a copy in a transaction still
open while the audit runs. A delayed message sent in an aborted transaction never
reached the daemon. read_committed must count only the committed copy as a duplicate
(and not wait on the open transaction); read_uncommitted must count all three copies;
neither may count the aborted delayed message as accepted (the delay topics are read as
the daemon reads them), so both audits pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from delayservice.producer import DelayProducer

# Two Spark audits (about 90 s): CI's audit of a real broker is test_audit_e2e.
pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.long]


def _audit(config: Path, out: Path, isolation: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYSERVICE_")}
    if isolation is not None:  # the environment variable, as a cron job would set it
        env["DELAYSERVICE_AUDIT_ISOLATION"] = isolation
    return subprocess.run(
        [sys.executable, "-m", "delayservice", "audit", "--config", str(config),
         "--grace", "1s", "--out", str(out), "--conf", "spark.sql.shuffle.partitions=2"],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip


def _transactional(bootstrap: str, tag: str, name: str) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"audit-{tag}-{name}",
            # Longer than both audits: the open transaction must outlive them.
            "transaction.timeout.ms": 600_000,
        }
    )
    producer.init_transactions(30)
    return producer


def _copy(producer: Producer, record: Any) -> None:
    """The forwarded record again: same partition, key, value and headers."""
    producer.produce(
        record.topic(),
        record.value(),
        record.key(),
        partition=record.partition(),
        headers=record.headers(),
    )


def _id(record: Any) -> str:
    return str(dict(record.headers())["delay-id"].decode())


def _rows(spark: Any, out: Path) -> dict[str, Any]:
    return {r["id"]: r for r in spark.read.parquet(str(out / "messages.parquet")).collect()}


def test_read_uncommitted_counts_aborted_copies_as_duplicates_and_read_committed_does_not(
    testbed, spark, tmp_path
):
    settings = testbed.settings(partitions=2)
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(f"orders-{testbed.tag}", partitions=2)
    daemon = testbed.start_daemon(settings)
    testbed.wait_assigned(daemon, partitions=settings.partitions)
    producer = testbed.producer(settings)
    sent = {producer.produce(target, f"v{i}".encode(), key=f"k{i}", delay=1) for i in range(6)}
    assert producer.flush(10) == 0
    withdrawn = DelayProducer(
        {"bootstrap.servers": testbed.bootstrap, "transactional.id": f"app-{testbed.tag}"},
        settings=settings,
    )
    withdrawn.init_transactions(30)
    withdrawn.begin_transaction()
    never_sent = withdrawn.produce(target, b"aborted", delay=1)
    withdrawn.abort_transaction(30)
    forwarded = testbed.collect(target, 6)
    assert {_id(r) for r in forwarded} == sent
    daemon.stop()

    aborted, committed, still_open = forwarded[0], forwarded[1], forwarded[2]
    first = _transactional(testbed.bootstrap, testbed.tag, "first")
    first.begin_transaction()
    _copy(first, aborted)
    assert first.flush(10) == 0  # in the log, then aborted: what a redone forward leaves
    first.abort_transaction(30)
    first.begin_transaction()
    _copy(first, committed)
    first.commit_transaction(30)
    hanging = _transactional(testbed.bootstrap, testbed.tag, "open")
    hanging.begin_transaction()
    _copy(hanging, still_open)
    assert hanging.flush(10) == 0
    config = tmp_path / "audit.toml"
    config.write_text(
        f'bootstrap_servers = "{testbed.bootstrap}"\nlevels = "{settings.levels}"\n'
        f'topic_prefix = "{settings.topic_prefix}"\n'
    )
    try:
        runs = {
            "read_committed": _audit(config, tmp_path / "committed", None),
            "read_uncommitted": _audit(config, tmp_path / "uncommitted", "read_uncommitted"),
        }
    finally:
        hanging.abort_transaction(30)

    for isolation, run in runs.items():
        assert run.returncode == 0, run.stdout + run.stderr
        assert run.stdout.splitlines()[0].startswith(f"target topics read {isolation} ("), (
            run.stdout
        )
        assert "delay topics read read_committed, as the daemon reads them" in run.stdout
    committed_view = json.loads((tmp_path / "committed" / "summary.json").read_text())
    uncommitted_view = json.loads((tmp_path / "uncommitted" / "summary.json").read_text())
    assert committed_view["isolation"]["target_topics"] == "read_committed"
    assert uncommitted_view["isolation"]["target_topics"] == "read_uncommitted"
    for view in (committed_view, uncommitted_view):
        assert {k: view["total"][k] for k in ("accepted", "delivered", "missing", "early")} == {
            "accepted": 6,
            "delivered": 6,
            "missing": 0,
            "early": 0,
        }
    assert committed_view["total"]["duplicated"] == 1
    assert uncommitted_view["total"]["duplicated"] == 3
    # Rows read: six forwards plus the copies each reader sees (markers are not rows).
    assert committed_view["records_read"]["target_topics"] == 6 + 1
    assert uncommitted_view["records_read"]["target_topics"] == 6 + 3

    seen_committed = _rows(spark, tmp_path / "committed")
    seen_uncommitted = _rows(spark, tmp_path / "uncommitted")
    assert never_sent not in seen_committed
    assert never_sent not in seen_uncommitted
    assert {i for i, r in seen_committed.items() if r["duplicated"]} == {_id(committed)}
    assert {i for i, r in seen_uncommitted.items() if r["duplicated"]} == {
        _id(aborted),
        _id(committed),
        _id(still_open),
    }
    assert seen_uncommitted[_id(aborted)]["deliveries"] == 2
    assert seen_committed[_id(aborted)]["deliveries"] == 1
