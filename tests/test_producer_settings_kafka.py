"""The producer and the daemon read one source of settings: a TOML file of its own levels
and prefix, named by DELAYSERVICE_CONFIG (or given as `config_file=`), starts a daemon
as systemd and compose do, and a producer beside it agrees with it by construction."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from delayservice.errors import DelayTooLongError
from delayservice.ports import free_port
from delayservice.producer import DelayProducer

pytestmark = pytest.mark.kafka


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _cli_env(config: Path) -> dict[str, str]:
    """This process's environment with no setting but the file's name."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DELAYSERVICE_")}
    return {**clean, "DELAYSERVICE_CONFIG": str(config)}


@pytest.fixture
def own_settings_file(testbed, tmp_path) -> Path:
    config = tmp_path / "delayservice.toml"
    config.write_text(
        f'bootstrap_servers = "{testbed.bootstrap}"\n'
        'levels = "1s,3s"\n'
        f'topic_prefix = "own-{testbed.tag}-"\n'
        f'dead_letter_topic = "own-dlq-{testbed.tag}"\n'
        f'group_id = "own-{testbed.tag}"\n'
        f'instance_name = "own-{testbed.tag}"\n'
        'metrics_host = "127.0.0.1"\n'
        f"metrics_port = {free_port()}\n"
        "shutdown_timeout_s = 15.0\n"
    )
    return config


def test_a_producer_and_a_daemon_started_from_one_file_agree(
    testbed, own_settings_file, monkeypatch
):
    config = own_settings_file
    port = int(config.read_text().split("metrics_port = ")[1].split()[0])
    env = _cli_env(config)
    created = subprocess.run(
        [sys.executable, "-m", "delayservice", "topics", "create"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert f"own-{testbed.tag}-2" in created.stdout
    target = testbed.create_topic(f"target-{testbed.tag}")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "delayservice", "run"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        testbed.wait_for(lambda: _ready(port) or daemon.poll() is not None, 60, "the daemon")
        assert daemon.poll() is None, daemon.stderr.read() if daemon.stderr else ""
        monkeypatch.setenv("DELAYSERVICE_CONFIG", str(config))
        delivered = []
        with DelayProducer({"bootstrap.servers": testbed.bootstrap}) as producer:
            assert producer.levels.spec() == "1s,3s"
            with pytest.raises(DelayTooLongError, match=r"top level \(3s\)"):
                producer.produce(target, b"too long", delay=60)
            message_id = producer.produce(
                target, b"two", delay="2s", on_delivery=lambda err, msg: delivered.append(msg)
            )
        (written,) = delivered
        assert written.topic() == f"own-{testbed.tag}-2", "the level topic the daemon reads"
        monkeypatch.delenv("DELAYSERVICE_CONFIG")
        named = DelayProducer({"bootstrap.servers": testbed.bootstrap}, config_file=config)
        assert named.levels.spec() == "1s,3s"
        (forwarded,) = testbed.collect(target, 1, timeout=60)
        assert dict(forwarded.headers())["delay-id"].decode() == message_id
        assert forwarded.value() == b"two"
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0, daemon.stderr.read() if daemon.stderr else ""


def test_the_environment_wins_over_the_file_for_the_producer_as_for_the_daemon(
    testbed, own_settings_file, monkeypatch
):
    monkeypatch.setenv("DELAYSERVICE_CONFIG", str(own_settings_file))
    monkeypatch.setenv("DELAYSERVICE_LEVELS", "1s,3s,1m")
    producer = DelayProducer({"bootstrap.servers": testbed.bootstrap})
    assert producer.levels.select(60_000).topic == f"own-{testbed.tag}-3"
    with pytest.raises(ValueError, match="not both"):
        DelayProducer({}, config_file=own_settings_file, settings=producer._settings)
