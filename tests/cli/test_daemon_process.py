"""`delayservice run` as a real process, sent real signals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = pytest.mark.kafka


def _env(settings, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYSERVICE_")}
    env.update(
        {
            "DELAYSERVICE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            "DELAYSERVICE_LEVELS": settings.levels,
            "DELAYSERVICE_TOPIC_PREFIX": settings.topic_prefix,
            "DELAYSERVICE_DEAD_LETTER_TOPIC": settings.dead_letter_topic,
            "DELAYSERVICE_GROUP_ID": settings.group_id,
            "DELAYSERVICE_COMMIT_INTERVAL_S": "0.5",
            "DELAYSERVICE_METRICS_HOST": "127.0.0.1",
            "DELAYSERVICE_METRICS_PORT": str(port),
            "DELAYSERVICE_SHUTDOWN_TIMEOUT_S": "15",
            # A killed member holds its partitions until its session times out (45 s default).
            "DELAYSERVICE_CONSUMER": '{"session.timeout.ms": "6000"}',
        }
    )
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "delayservice", "run"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        text = response.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_kill_9_mid_stream_then_restart_delivers_every_message_at_least_once(testbed):
    settings = testbed.settings(levels="1s,2s")
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(f"crash-{testbed.tag}")
    port = _free_port()
    env = _env(settings, port)
    process = _start(env)
    try:
        testbed.wait_for(lambda: _ready(port), 60, "the daemon to be ready")
        producer = testbed.producer(settings)
        ids = set()
        for i in range(3000):
            ids.add(
                producer.produce(
                    target, f"m{i}".encode(), key=f"k{i % 50}".encode(), delay=1 + i % 2
                )
            )
            if i % 500 == 0:
                producer.flush(10)
        producer.flush(10)
        testbed.wait_for(
            lambda: _metric(port, "delayservice_forwarded_total") > 500,
            60,
            "some messages to be forwarded",
        )
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        forwarded_before = "killed"
    finally:
        if process.poll() is None:
            process.kill()
    assert forwarded_before == "killed"
    restarted = _start(env)
    try:
        delivered = testbed.collect(target, len(ids), timeout=90)
        got = {dict(r.headers())["delay-id"].decode() for r in delivered}
        deadline = time.monotonic() + 60
        while not ids <= got and time.monotonic() < deadline:
            got |= {
                dict(r.headers())["delay-id"].decode()
                for r in testbed.collect(target, len(got) + 1, timeout=5)
            }
        assert ids <= got, f"{len(ids - got)} messages lost"
    finally:
        restarted.send_signal(signal.SIGTERM)
        restarted.wait(30)


def test_sigterm_commits_flushes_and_exits_0_within_the_timeout(testbed):
    settings = testbed.settings(levels="1s")
    testbed.create_delay_topics(settings)
    port = _free_port()
    process = _start(_env(settings, port))
    testbed.wait_for(lambda: _ready(port), 60, "the daemon to be ready")
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(20) == 0
    assert time.monotonic() - started < 20
    assert b"received SIGTERM, stopping" in process.stdout.read()


def test_unreachable_broker_reports_not_ready_and_still_stops_cleanly():
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYSERVICE_")}
    env.update(
        {
            "DELAYSERVICE_BOOTSTRAP_SERVERS": f"127.0.0.1:{_free_port()}",
            "DELAYSERVICE_METRICS_HOST": "127.0.0.1",
            "DELAYSERVICE_METRICS_PORT": str(port),
        }
    )
    process = _start(env)
    try:
        deadline = time.monotonic() + 30
        answer = None
        while answer is None and time.monotonic() < deadline:
            check = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "delayservice",
                    "check",
                    "--url",
                    f"http://127.0.0.1:{port}/readyz",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if "not ready" in check.stderr:
                answer = check
        assert answer is not None
        assert answer.returncode == 1
        assert "waiting for the broker" in answer.stderr
        process.send_signal(signal.SIGINT)
        assert process.wait(20) == 0
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"DELAYSERVICE_LEVELS": "1s,banana"}, "invalid setting levels"),
        ({"DELAYSERVICE_PAUSE_HIGH_WATR": "3"}, "DELAYSERVICE_PAUSE_HIGH_WATR: unknown setting"),
    ],
)
def test_bad_configuration_stops_start_up_with_one_line_and_exit_2(env, expected):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DELAYSERVICE_")}
    result = subprocess.run(
        [sys.executable, "-m", "delayservice", "run"],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert expected in result.stderr


def test_a_metrics_port_in_use_is_a_configuration_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        clean = {k: v for k, v in os.environ.items() if not k.startswith("DELAYSERVICE_")}
        result = subprocess.run(
            [sys.executable, "-m", "delayservice", "run"],
            env={
                **clean,
                "DELAYSERVICE_METRICS_HOST": "127.0.0.1",
                "DELAYSERVICE_METRICS_PORT": str(port),
            },
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 2
    assert "invalid setting metrics_port" in result.stderr
