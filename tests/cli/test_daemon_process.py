"""`delayservice run` as a real process, sent real signals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_LOG_APPEND_TIME, Consumer, TopicPartition

from delayservice.ports import free_port
from delayservice.settings_loading import settings_env

pytestmark = pytest.mark.kafka


def _env(settings, port: int, instance: str, session_timeout_s: float = 6) -> dict[str, str]:
    """Environment of one daemon process; `instance` is its static-membership name, so
    a restart with the same environment takes the dead process's partitions back."""
    return settings_env(
        settings,
        commit_interval_s=0.5,
        metrics_host="127.0.0.1",
        metrics_port=port,
        shutdown_timeout_s=15,
        instance_name=instance,
        session_timeout_s=session_timeout_s,
    )


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


def _delay_id(record) -> str:
    return dict(record.headers())["delay-id"].decode()


def _read_all(bootstrap: str, topic: str, timeout: float = 30) -> list:
    """Every record `topic` holds right now (up to each partition's end offset)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-all-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    try:
        partitions = list(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        }
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        pending = {p for p, end in ends.items() if end > 0}
        records = []
        deadline = time.monotonic() + timeout
        while pending:
            assert time.monotonic() < deadline, f"{topic}: could not read to the end"
            records.extend(
                m
                for m in consumer.consume(1000, 0.5)
                if m.error() is None and m.offset() < ends[m.partition()]
            )
            # Positions, not record offsets: they also move past any control records.
            for tp in consumer.position([TopicPartition(topic, p) for p in pending]):
                if tp.offset >= ends[tp.partition]:
                    pending.discard(tp.partition)
        return records
    finally:
        consumer.close()


def _read_until_ids(bootstrap: str, topic: str, ids: set[str], timeout: float) -> list:
    """Re-read `topic` until it holds every id or `timeout` passes; returns what it holds."""
    deadline = time.monotonic() + timeout
    while True:
        records = _read_all(bootstrap, topic)
        if ids <= {_delay_id(r) for r in records} or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def test_kill_9_mid_stream_then_restart_delivers_every_message_at_least_once(testbed):
    settings = testbed.settings(levels="1s,2s")
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(f"crash-{testbed.tag}")
    port = free_port()
    env = _env(settings, port, instance=f"{testbed.tag}-crash")
    process = _start(env)
    forwarded = 0.0
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
        assert producer.flush(10) == 0

        def some_forwarded() -> bool:
            nonlocal forwarded
            forwarded = _metric(port, "delayservice_forwarded_total")
            return forwarded > 500

        testbed.wait_for(some_forwarded, 60, "some messages to be forwarded")
        process.send_signal(signal.SIGKILL)
        assert process.wait(10) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
    # Mid-stream: what the killed process had acknowledged is on the target, not all of it.
    before = {_delay_id(r) for r in _read_all(testbed.bootstrap, target)}
    assert before <= ids
    assert len(before) >= forwarded > 500
    assert len(before) < len(ids), "everything was forwarded before the kill"
    restarted = _start(env)
    try:
        delivered = _read_until_ids(testbed.bootstrap, target, ids, timeout=90)
        got = {_delay_id(r) for r in delivered}
        assert ids <= got, f"{len(ids - got)} messages lost"
    finally:
        restarted.send_signal(signal.SIGTERM)
        restarted.wait(30)


def test_a_restart_under_the_same_instance_name_takes_the_partitions_back_at_once(testbed):
    """Static membership: with a 45 s session, a restart that had to wait for the killed
    member's session to expire would deliver nothing for 45 s; reclaiming is immediate."""
    session_timeout_s = 45
    settings = testbed.settings(levels="1s")
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(
        f"static-{testbed.tag}", config={"message.timestamp.type": "LogAppendTime"}
    )
    port = free_port()
    env = _env(settings, port, f"{testbed.tag}-static", session_timeout_s=session_timeout_s)
    producer = testbed.producer(settings)
    first = _start(env)
    try:
        testbed.wait_for(lambda: _ready(port), 60, "the daemon to be ready")
        # A forwarded probe shows the first process really owns the level's partitions.
        probe = producer.produce(target, b"probe", delay=1)
        assert producer.flush(10) == 0
        assert {_delay_id(r) for r in testbed.collect(target, 1)} == {probe}
        first.send_signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
    finally:
        if first.poll() is None:
            first.kill()
    restarted_ms = time.time() * 1000
    restarted = _start(env)
    try:
        ids = {
            producer.produce(target, f"s{i}".encode(), key=f"k{i}".encode(), delay=1)
            for i in range(300)
        }
        assert producer.flush(10) == 0
        # Read past the session timeout, so a failure shows how long delivery really took.
        records = _read_until_ids(testbed.bootstrap, target, ids, timeout=session_timeout_s + 60)
        assert restarted.poll() is None, "the restarted daemon exited"
    finally:
        restarted.send_signal(signal.SIGTERM)
        try:
            restarted.wait(30)
        except subprocess.TimeoutExpired:
            restarted.kill()
    arrived: dict[str, int] = {}
    for record in records:
        kind, stamp = record.timestamp()
        assert kind == TIMESTAMP_LOG_APPEND_TIME
        due = int(dict(record.headers())["delay-due-ms"])
        assert stamp >= due, f"{_delay_id(record)} arrived {due - stamp} ms before it was due"
        if _delay_id(record) in ids:
            arrived[_delay_id(record)] = min(stamp, arrived.get(_delay_id(record), stamp))
    missing = ids - arrived.keys()
    assert not missing, f"{len(missing)} of {len(ids)} never arrived after the restart"
    last_s = (max(arrived.values()) - restarted_ms) / 1000
    first_s = (min(arrived.values()) - restarted_ms) / 1000
    assert last_s < 20, (
        f"records arrived {first_s:.1f}-{last_s:.1f}s after the restart "
        f"(session timeout {session_timeout_s}s): partitions were not taken back at once"
    )


def test_sigterm_commits_flushes_and_exits_0_within_the_timeout(testbed):
    settings = testbed.settings(levels="1s")
    testbed.create_delay_topics(settings)
    port = free_port()
    process = _start(_env(settings, port, f"{testbed.tag}-term"))
    testbed.wait_for(lambda: _ready(port), 60, "the daemon to be ready")
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(20) == 0
    assert time.monotonic() - started < 20
    assert b"received SIGTERM, stopping" in process.stdout.read()


def test_unreachable_broker_reports_not_ready_and_still_stops_cleanly():
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYSERVICE_")}
    env.update(
        {
            "DELAYSERVICE_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
            "DELAYSERVICE_INSTANCE_NAME": f"unreachable-{uuid.uuid4().hex[:8]}",
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
