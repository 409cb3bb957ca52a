from __future__ import annotations

import os
import subprocess
import sys

import pytest

COMMANDS = [
    [],
    ["run"],
    ["send"],
    ["check"],
    ["topics"],
    ["topics", "create"],
    ["topics", "describe"],
]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DELAYSERVICE_")}
    return subprocess.run(
        [sys.executable, "-m", "delayservice", *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "root")
def test_every_command_has_help(command):
    result = _cli(*command, "--help")
    assert result.returncode == 0
    assert "Usage:" in result.stdout


def test_version():
    assert _cli("--version").stdout.strip() == "delayservice 0.1.0"


def test_send_refuses_bad_input_with_exit_2():
    assert "not a duration" in _cli("send", "t", "v", "--delay", "soon").stderr
    assert _cli("send", "t", "v", "-H", "novalue").returncode == 2


@pytest.mark.kafka
def test_send_delivers_one_delayed_message(testbed):
    settings = testbed.settings(levels="1s,2s")
    testbed.create_delay_topics(settings)
    env = {
        "DELAYSERVICE_LEVELS": settings.levels,
        "DELAYSERVICE_TOPIC_PREFIX": settings.topic_prefix,
    }
    result = _cli(
        "send", "orders", "hello", "--delay", "2s", "-k", "k1", "-H", "trace=t1",
        "-b", testbed.bootstrap, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    message_id = result.stdout.strip()
    (record,) = testbed.collect(f"{settings.topic_prefix}2", 1)
    headers = dict(record.headers())
    assert headers["delay-id"].decode() == message_id
    assert headers["trace"] == b"t1"
    assert (record.key(), record.value()) == (b"k1", b"hello")
