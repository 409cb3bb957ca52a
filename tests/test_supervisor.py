"""`processes = 2` on a real broker: one endpoint, partitions spread, a dead worker replaced."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from delayservice.ports import free_port
from delayservice.settings_loading import settings_env

pytestmark = pytest.mark.kafka


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def _children(pid: int) -> set[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return {int(p) for p in path.read_text().split()} if path.exists() else set()


def _owned(readyz: str) -> dict[str, set[tuple[str, int]]]:
    """worker name -> {(level topic, partition)} from the supervisor's /readyz answer."""
    owned: dict[str, set[tuple[str, int]]] = {}
    for part in readyz.split(" | "):
        worker, _, rest = part.partition(": ")
        worker = worker.removeprefix("ready: ").removeprefix("not ready: ")
        owned[worker] = {
            (topic, int(p))
            for topic, parts in re.findall(r"(\S+): owns ([\d,]+)", rest)
            for p in parts.split(",")
        }
    return owned


def _forwarded(port: int) -> float:
    _, text = _get(port, "/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return sum(
        s.value for s in families["delayservice_forwarded"].samples if s.name.endswith("_total")
    )


def test_two_worker_processes_share_every_level_behind_one_endpoint(testbed, tmp_path):
    settings = testbed.settings(levels="1s,2s", processes=2)
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(
        f"sup-{testbed.tag}", 3, {"message.timestamp.type": "LogAppendTime"}
    )
    port = free_port()
    log = (tmp_path / "supervisor.log").open("wb")
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "delayservice", "run"],
        env=settings_env(
            settings,
            metrics_port=port,
            instance_name=f"sup-{testbed.tag}",
            session_timeout_s=6,
            commit_interval_s=0.5,
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        testbed.wait_for(lambda: _get(port, "/readyz")[0] == 200, 90, "both workers ready")
        owned = _owned(_get(port, "/readyz")[1])
        assert len(owned) == 2, owned
        every = {(level.topic, p) for level in settings.level_set() for p in range(3)}

        def spread() -> bool:
            nonlocal owned
            owned = _owned(_get(port, "/readyz")[1])
            mine = list(owned.values())
            return len(mine) == 2 and all(mine) and set.union(*mine) == every

        testbed.wait_for(spread, 60, "the groups to spread the partitions over both workers")
        assert not set.intersection(*owned.values())

        producer = testbed.producer(settings)
        for i in range(200):
            producer.produce(target, b"v", str(i).encode(), delay=1 + i % 2)
        producer.flush(30)
        records = testbed.collect(target, 200, timeout=60)
        assert len({dict(r.headers())["delay-id"] for r in records}) == 200
        testbed.wait_for(lambda: _forwarded(port) == 200, 30, "the merged count to reach 200")

        # A worker killed outright is replaced under its name and takes its share back.
        victim = min(_children(supervisor.pid))
        survivors = _children(supervisor.pid) - {victim}
        subprocess.run(["kill", "-9", str(victim)], check=True)
        testbed.wait_for(
            lambda: (
                len(_children(supervisor.pid) - survivors - {victim}) == 1
                and _get(port, "/readyz")[0] == 200
            ),
            90,
            "a replacement worker and readiness again",
        )
        for i in range(100):
            producer.produce(target, b"w", str(i).encode(), delay=1)
        producer.flush(30)
        testbed.collect(target, 300, timeout=60)
        assert supervisor.poll() is None

        workers = _children(supervisor.pid)
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(60) == 0
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() for pid in workers):
            assert time.monotonic() < deadline, "workers outlived their supervisor"
            time.sleep(0.1)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait(30)
        log.close()


def test_workers_stop_when_their_supervisor_is_killed_outright(testbed, tmp_path):
    settings = testbed.settings(levels="1s", processes=2)
    testbed.create_delay_topics(settings)
    port = free_port()
    log = (tmp_path / "supervisor.log").open("wb")
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "delayservice", "run"],
        env=settings_env(settings, metrics_port=port, instance_name=f"orphan-{testbed.tag}"),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        testbed.wait_for(lambda: _get(port, "/readyz")[0] == 200, 90, "both workers ready")
        workers = _children(supervisor.pid)
        assert len(workers) == 2
        supervisor.kill()
        supervisor.wait(10)
        testbed.wait_for(
            lambda: not any(_alive(pid) for pid in workers), 30, "the orphaned workers to stop"
        )
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait(30)
        log.close()


def _alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for a parent that no longer reaps."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
