"""A real Prometheus scrapes a real daemon forwarding real messages, with the rules loaded.

Prometheus (Debian's package) runs on loopback with the job and metrics path of
deploy/prometheus/prometheus.yml, a 1 s scrape and evaluation interval, and
deploy/prometheus/alerts.yml. Two daemons get traffic that exercises every metric: the
first forwards due messages on two levels and dead-letters a record without an
envelope; the second reads its level but its producer cannot reach the broker, so its
forwards fail and are retried (delayservice_forward_errors_total).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from delayservice.ports import free_port
from delayservice.producer import DelayProducer

pytestmark = [pytest.mark.prometheus, pytest.mark.kafka]

DEADLINE_S = 60.0


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=5) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("/api/v1/query", query=expr)
        return data["result"] if data["resultType"] == "vector" else [data["result"]]


def wait_until(what: str, probe: Callable[[], Any]) -> Any:
    """Poll `probe` until it returns something truthy; fail with its last answer."""
    deadline = time.monotonic() + DEADLINE_S
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except OSError as exc:  # Prometheus not listening yet
            last = exc
        else:
            if last and not isinstance(last, Mismatch):
                return last
        time.sleep(0.25)
    pytest.fail(f"timed out after {DEADLINE_S:.0f}s waiting for {what}; last: {last!r}")


class Mismatch(str):
    """A falsy-by-type answer of a probe that explains what is still missing."""


def prometheus_config(deploy, metrics_ports: list[int]) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with the daemons as its only, fast-scraped targets."""
    config = deploy.load_yaml(deploy.prometheus_dir / "prometheus.yml")
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(deploy.alerts)]
    (job,) = config["scrape_configs"]
    job.pop("file_sd_configs")
    job["scrape_timeout"] = "1s"
    job["static_configs"] = [{"targets": [f"127.0.0.1:{port}" for port in metrics_ports]}]
    return config


@pytest.fixture
def start_prometheus(deploy, tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], Prometheus]]:
    binary = deploy.need_tool("prometheus")
    processes: list[subprocess.Popen[bytes]] = []

    def start(config: dict[str, Any]) -> Prometheus:
        config_file = tmp_path / "prometheus.yml"
        config_file.write_text(json.dumps(config))  # JSON is YAML
        port = free_port()
        log = (tmp_path / "prometheus.log").open("wb")
        processes.append(subprocess.Popen(
            [binary, f"--config.file={config_file}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT,
        ))  # fmt: skip
        server = Prometheus(f"http://127.0.0.1:{port}")
        wait_until("Prometheus to be ready", lambda: server.api("/api/v1/status/runtimeinfo"))
        return server

    yield start
    for process in processes:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def send_traffic(testbed, settings, stranded) -> None:
    target = testbed.create_topic(f"prom-orders-{testbed.tag}", partitions=1)
    producer = testbed.producer(settings)
    for i in range(20):
        producer.produce(target, f"m{i}".encode(), key=f"k{i % 4}".encode(), delay=1 + i % 2)
    # A level message cancelled by id: the level markers' counter gets its first sample.
    producer.cancel(producer.produce(target, b"cancelled", key=b"k0", delay=2))
    # Straight to a level topic without an envelope: dead-lettered.
    producer.produce(next(iter(settings.level_set())).topic, b"no envelope")
    assert producer.flush(10) == 0
    exact = DelayProducer(
        {"bootstrap.servers": testbed.bootstrap}, settings=settings, precision="exact"
    )
    exact.produce(target, b"exact", delay=1.5)
    exact.cancel(exact.produce(target, b"cancelled", delay=3))
    assert exact.flush(10) == 0
    to_stranded = testbed.producer(stranded)
    to_stranded.produce(target, b"stranded", delay=1)
    assert to_stranded.flush(10) == 0


def test_prometheus_scrapes_every_metric_the_dashboard_and_alerts_use(
    deploy, testbed, start_prometheus, tmp_path
):
    settings = testbed.settings(
        levels="1s,2s",
        partitions=1,
        precise=True,
        precise_topic=f"dp-{testbed.tag}",
        data_dir=tmp_path / "wheel",
    )
    # A second instance, on its own topics, whose forwards cannot reach the broker.
    stranded = testbed.settings(
        levels="1s",
        partitions=1,
        topic_prefix=f"dt-stranded-{testbed.tag}-",
        group_id=f"ds-stranded-{testbed.tag}",
        producer={"bootstrap.servers": "127.0.0.1:1"},
        shutdown_timeout_s=5,
    )
    daemons = []
    for instance in (settings, stranded):
        testbed.create_delay_topics(instance)
        daemons.append(testbed.start_daemon(instance))
        testbed.wait_assigned(daemons[-1], partitions=1)
    server = start_prometheus(prometheus_config(deploy, [d.metrics_port for d in daemons]))
    send_traffic(testbed, settings, stranded)

    used = deploy.used_metric_names()
    pattern = "|".join(sorted(used))

    def names_with_data() -> set[str] | Mismatch:
        found = {s["metric"]["__name__"] for s in server.query(f'{{__name__=~"{pattern}"}}')}
        return found if found >= set(used) else Mismatch(f"no data yet for {set(used) - found}")

    wait_until("data for every metric the dashboard and the rules use", names_with_data)

    # Real work behind the names: forwarded, late-measured, dead-lettered, retried.
    evidence = {
        "forwarded on both levels": (
            'count(delayservice_forwarded_total{level=~"1s|2s"} > 0) == 2'
        ),
        "lateness observed": "sum(delayservice_lateness_seconds_count) > 0",
        "commit points timed": 'sum(delayservice_commit_step_seconds_count{step="flush"}) > 0',
        "dead-lettered without envelope": (
            'delayservice_dead_lettered_total{reason="invalid_envelope"} > 0'
        ),
        "forward errors retried": "sum(delayservice_forward_errors_total) > 0",
        # Taken, its metadata failing for seconds, put back behind a retry's hold: the
        # stranded record is overdue at every scrape, never "nothing held".
        "stranded forward overdue throughout": (
            "min_over_time(delayservice_oldest_overdue_seconds"
            f'{{instance="127.0.0.1:{daemons[1].metrics_port}"}}[5s]) > 0'
        ),
        "ready": "delayservice_ready == 1",
        "forwarded in precise mode": 'delayservice_forwarded_total{level="exact"} > 0',
        "cancelled in precise mode": (
            'delayservice_precise_cancels_total{outcome="cancelled"} > 0'
        ),
        "cancelled in level mode": (
            'delayservice_level_markers_total{kind="cancel", outcome="cancelled"} > 0'
        ),
        "scraped": 'up{job="delayservice"} == 1',
    }
    for what, expr in evidence.items():
        wait_until(what, lambda expr=expr: server.query(expr))

    # Every dashboard query runs and returns series, with Grafana's variables filled in.
    for title, expr in deploy.dashboard_exprs():
        filled = (
            expr.replace("$__rate_interval", "30s")
            .replace("$instance", ".*")
            .replace("$level", ".*")
        )
        wait_until(f"panel {title!r}: {filled}", lambda q=filled: server.query(q))

    # The rules are loaded and evaluate cleanly, and the dead letter fires its alert.
    def rules_healthy() -> list[dict[str, Any]] | Mismatch:
        rules = [r for g in server.api("/api/v1/rules")["groups"] for r in g["rules"]]
        bad = {r["name"]: r["health"] for r in rules if r["health"] != "ok"}
        return rules if rules and not bad else Mismatch(f"not (yet) ok: {bad}")

    rules = wait_until("every rule to evaluate with health ok", rules_healthy)
    assert {r["name"] for r in rules} == {r["alert"] for r in deploy.alert_rules()}

    def dead_letter_alert() -> list[dict[str, Any]]:
        alerts = server.api("/api/v1/alerts")["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "DelayServiceDeadLetters"]

    (alert,) = wait_until("DelayServiceDeadLetters to fire", dead_letter_alert)
    assert alert["state"] == "firing"
    assert alert["labels"]["reason"] == "invalid_envelope"
