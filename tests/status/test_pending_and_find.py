"""`delayservice pending` and `delayservice find` against a real daemon holding level and
precise messages, some waiting, one cancelled, one forwarded and one dead-lettered."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from delayservice.cli.app import app
from delayservice.settings import settings_env

pytestmark = pytest.mark.kafka

DAY_S = 86_400


def _cli(settings: Any, *args: str) -> Any:
    env = settings_env(settings)
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


def _id(message: Any) -> str:
    return dict(message.headers() or [])["delay-id"].decode()


@pytest.fixture
def holding(testbed: Any, tmp_path: Path) -> dict[str, Any]:
    """A daemon holding: 3 level messages due in a minute, 5 exact ones spread from 30 s
    to 40 days, and what became of one forwarded, one dead-lettered, one cancelled."""
    from delayservice.producer import DelayProducer

    settings = testbed.settings(
        levels="1s,1m",
        precise=True,
        precise_topic=f"dp-{testbed.tag}",
        data_dir=tmp_path / "data",
        precise_lookahead_s=2.0,
    )
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(f"target-{testbed.tag}")
    daemon = testbed.start_daemon(settings)
    testbed.wait_for(lambda: daemon.readiness()[0], 60, "the daemon to be ready")
    settings = settings.model_copy(update={"metrics_port": daemon.metrics_port})

    sent: dict[str, Any] = {"settings": settings, "target": target, "daemon": daemon}
    with DelayProducer({"bootstrap.servers": testbed.bootstrap}, settings=settings) as producer:
        sent["level_waiting"] = [producer.produce(target, b"w", delay=60) for _ in range(3)]
        sent["forwarded"] = producer.produce(target, b"f", delay=1)
        sent["dead"] = producer.produce(f"missing-{testbed.tag}", b"d", delay=1)
        sent["sent_ms"] = int(time.time() * 1000)
    with DelayProducer(
        {"bootstrap.servers": testbed.bootstrap}, settings=settings, precision="exact"
    ) as producer:
        sent["exact"] = {
            delay: producer.produce(target, b"e", delay=delay)
            for delay in (30, 2 * 3600, 2 * DAY_S, 20 * DAY_S, 40 * DAY_S)
        }
        sent["cancelled"] = producer.produce(target, b"c", delay=45)
        producer.flush(30)
        producer.cancel(sent["cancelled"])
    arrived = testbed.collect(target, 1, timeout=60)
    assert [_id(m) for m in arrived] == [sent["forwarded"]]
    sent["forwarded_at"] = (arrived[0].partition(), arrived[0].offset())
    testbed.collect(settings.dead_letter_topic, 1, timeout=60)

    def settled() -> bool:  # every exact message on disk, the cancel matched
        result = _cli(settings, "pending", "--json")
        rows = {r["level"]: r for r in json.loads(result.stdout)["rows"]}
        exact = rows["exact"]
        return exact["in_kafka"] == 0 and exact["held"] == 5 and rows["1m"]["held"] == 3

    testbed.wait_for(settled, 60, "the daemon to hold everything and match the cancel")
    return sent


def test_pending_counts_what_waits_by_level_and_by_due_time(holding):
    settings = holding["settings"]
    result = _cli(settings, "pending", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    rows = {r["level"]: r for r in report["rows"]}
    assert set(rows) == {"1s", "1m", "exact"}
    assert rows["1s"]["waiting"] == 0
    assert rows["1s"]["oldest_overdue_s"] == 0
    minute = rows["1m"]
    assert minute["waiting"] == 3
    assert minute["held"] == 3
    assert holding["sent_ms"] < minute["next_due_ms"] < holding["sent_ms"] + 61_000
    exact = rows["exact"]
    assert exact["by_due"] == {"overdue": 0, "1m": 1, "1h": 0, "1d": 1, "30d": 2, "later": 1}
    assert exact["waiting"] == 5
    assert exact["replica_copies"] == 0
    assert exact["oldest_overdue_s"] == 0

    text = _cli(settings, "pending")
    assert text.exit_code == 0
    assert "exact" in text.stdout
    assert "due: overdue 0 · 1m 1 · 1h 0 · 1d 1 · 30d 2" in text.stdout


def test_find_says_where_each_message_is(holding):
    settings = holding["settings"]

    def find(message_id: str) -> tuple[int, dict[str, Any]]:
        result = _cli(settings, "find", message_id, "--json", "--since", "10m")
        return result.exit_code, json.loads(result.stdout)

    code, waiting = find(holding["level_waiting"][0])
    assert code == 0
    assert waiting["state"] == "waiting"
    assert waiting["level"] == "1m"
    assert waiting["due_ms"] > time.time() * 1000

    code, forwarded = find(holding["forwarded"])
    assert forwarded["state"] == "forwarded"
    (copy,) = forwarded["forwarded"]
    assert (copy["topic"], copy["partition"], copy["offset"]) == (
        holding["target"],
        *holding["forwarded_at"],
    )
    assert copy["timestamp_ms"] >= forwarded["due_ms"]

    code, dead = find(holding["dead"])
    assert dead["state"] == "dead-lettered"
    assert [d["reason"] for d in dead["dead_lettered"]] == ["unknown_topic"]

    code, exact = find(holding["exact"][2 * DAY_S])
    assert exact["state"] == "waiting"
    assert exact["level"] == "exact"
    assert exact["source"]["partition"] == int(holding["exact"][2 * DAY_S].rsplit("-p", 1)[1])

    code, cancelled = find(holding["cancelled"])
    assert cancelled["state"] == "cancelled"
    assert len(cancelled["cancels"]) == 1

    code, missing = find("0" * 32 + "-p0")
    assert code == 1
    assert missing["state"] == "not found"
    assert missing["searched"]

    text = _cli(settings, "find", holding["forwarded"], "--since", "10m")
    assert f"forwarded   to {holding['target']} partition" in text.stdout


def test_the_daemons_gauges_give_the_same_figures(holding):
    from delayservice.precise.precise_worker import PreciseWorker

    daemon = holding["daemon"]
    (worker,) = [w for w in daemon.workers if isinstance(w, PreciseWorker)]
    worker.census.take()  # the background census runs every 30 s; take one now
    report = json.loads(_cli(holding["settings"], "pending", "--json").stdout)
    rows = {r["level"]: r for r in report["rows"]}
    url = f"http://127.0.0.1:{daemon.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}

    def value(name: str, **labels: str) -> float:
        (sample,) = [
            s
            for s in families[name].samples
            if all(s.labels.get(k) == v for k, v in labels.items())
        ]
        return sample.value

    for due, count in rows["exact"]["by_due"].items():
        assert value("delayservice_precise_pending_messages", copy="owner", due=due) == count
    assert (
        value("delayservice_next_due_timestamp_seconds", level="exact") * 1000
        == (rows["exact"]["next_due_ms"])
    )
    held_due = value("delayservice_next_due_timestamp_seconds", level="1m") * 1000
    assert held_due == rows["1m"]["next_due_ms"]  # the head it holds is the one in Kafka
    assert value("delayservice_oldest_overdue_seconds", level="1m") == 0
