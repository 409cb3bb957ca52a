from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

COMMANDS = [
    [],
    ["run"],
    ["send"],
    ["cancel"],
    ["reschedule"],
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


def test_settings_refuses_a_key_the_daemon_owns_with_one_line_and_exit_2():
    result = _cli("settings", env={"DELAYSERVICE_CONSUMER": '{"auto.offset.reset": "latest"}'})
    assert result.returncode == 2, result.stdout
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(
        "delayservice: invalid setting consumer: auto.offset.reset = 'latest' would skip "
    ), line
    assert line.endswith("the daemon owns this key: remove it or set 'earliest'"), line
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_send_refuses_bad_input_with_exit_2():
    assert "not a duration" in _cli("send", "t", "v", "--delay", "soon").stderr
    assert _cli("send", "t", "v", "-H", "novalue").returncode == 2


def _levels_on(testbed: Any) -> tuple[Any, dict[str, str]]:
    """Levels 1s and 2s on the test broker, their topics created: the settings, and the
    environment that gives a command the same."""
    settings = testbed.settings(levels="1s,2s")
    testbed.create_delay_topics(settings)
    return settings, {
        "DELAYSERVICE_LEVELS": settings.levels,
        "DELAYSERVICE_TOPIC_PREFIX": settings.topic_prefix,
        "DELAYSERVICE_MARKERS_TOPIC": settings.markers_topic,
    }


@pytest.mark.kafka
def test_send_delivers_one_delayed_message(testbed):
    settings, env = _levels_on(testbed)
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


@pytest.mark.kafka
def test_send_and_cancel_speak_json_with_bare_seconds_and_at(testbed):
    import json

    settings, env = _levels_on(testbed)
    sent = _cli("send", "orders", "hi", "-d", "2", "--json", "-b", testbed.bootstrap, env=env)
    assert sent.returncode == 0, sent.stderr
    landed = json.loads(sent.stdout)
    assert landed["topic"] == f"{settings.topic_prefix}2"
    assert landed["offset"] >= 0
    at = _cli(
        "send", "orders", "hi", "--at", "2999-01-01T00:00:00", "--json", "-b", testbed.bootstrap,
        env=env,
    )  # fmt: skip
    assert at.returncode == 2  # far beyond the top level: refused, in one line
    assert len(at.stderr.strip().splitlines()) == 1
    cancel = _cli("cancel", landed["id"], "--wait", "0", "--json", "-b", testbed.bootstrap, env=env)
    assert cancel.returncode == 0, cancel.stderr
    answer = json.loads(cancel.stdout)
    assert (answer["kind"], answer["id"], answer["reply"]) == ("cancel", landed["id"], None)
    assert answer["landed"]["offset"] >= 0


@pytest.mark.kafka
def test_send_exact_goes_to_the_precise_topic_with_its_own_delay(testbed):
    from delayservice.producer import precise_partition

    settings = testbed.settings(levels="1s", precise=True, precise_topic=f"dp-{testbed.tag}")
    testbed.create_delay_topics(settings)
    env = {
        "DELAYSERVICE_LEVELS": settings.levels,
        "DELAYSERVICE_TOPIC_PREFIX": settings.topic_prefix,
        "DELAYSERVICE_PRECISE_TOPIC": settings.precise_topic,
    }
    result = _cli(
        "send", "orders", "hello", "--delay", "1700ms", "--exact", "-b", testbed.bootstrap,
        env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    message_id = result.stdout.strip()
    (record,) = testbed.collect(settings.precise_topic, 1)
    headers = dict(record.headers())
    assert headers["delay-id"].decode() == message_id
    assert headers["delay-ms"] == b"1700"
    assert record.partition() == precise_partition(message_id, settings.partitions)


def test_cancel_refuses_an_empty_id_with_exit_2():
    result = _cli("cancel", "")
    assert result.returncode == 2
    assert "the message id is empty" in result.stderr


@pytest.mark.kafka
def test_cancel_sends_a_marker_to_the_partition_of_the_id(testbed):
    from delayservice.kafka import topics
    from delayservice.producer import precise_partition

    settings = testbed.settings(
        levels="1s", precise=True, precise_topic=f"dp-{testbed.tag}", partitions=3
    )
    topics.create(testbed.admin, settings)
    testbed.wait_for(
        lambda: all(s.exists for s in topics.describe(testbed.admin, settings, timeout=5)),
        30,
        "the precise topic in the metadata",
    )
    message_id = "0123456789abcdef0123456789abcdef"
    partition = precise_partition(message_id, 3)
    env = {
        "DELAYSERVICE_PRECISE": "true",  # an id of no known form goes to the precise topic
        "DELAYSERVICE_PRECISE_TOPIC": settings.precise_topic,
        "DELAYSERVICE_LEVELS": settings.levels,
        "DELAYSERVICE_TOPIC_PREFIX": settings.topic_prefix,
    }
    result = _cli("cancel", message_id, "--wait", "0", "-b", testbed.bootstrap, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"cancel of {message_id} is on {settings.precise_topic} partition {partition} offset 0"
    )
    (marker,) = testbed.collect(settings.precise_topic, 1)
    assert marker.partition() == partition
    assert (marker.key(), marker.value()) == (None, None)
    assert marker.headers() == [("delay-v", b"1"), ("delay-cancel", message_id.encode())]


@pytest.mark.kafka
def test_cancel_without_the_precise_topic_fails_in_one_line(testbed):
    env = {"DELAYSERVICE_PRECISE": "true", "DELAYSERVICE_PRECISE_TOPIC": f"nope-{testbed.tag}"}
    result = _cli("cancel", "abc", "--wait", "0", "-b", testbed.bootstrap, env=env)
    assert result.returncode == 1
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(
        f"delayservice: the broker answered that the topic nope-{testbed.tag} does not exist"
    )
    assert "delayservice topics create" in line
    # Waiting for the reply needs the outcomes topic: it is checked before anything is sent.
    result = _cli("reschedule", "abc", "--delay", "5s", "-b", testbed.bootstrap, env=env)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(
        f"delayservice: the broker answered that the outcomes topic nope-{testbed.tag}_outcomes "
        "does not exist"
    )


def test_reschedule_refuses_bad_input_with_exit_2():
    assert _cli("reschedule", "", "--delay", "5s").returncode == 2
    both = _cli("reschedule", "abc", "--delay", "5s", "--at", "2030-01-01T00:00:00")
    assert both.returncode == 2
    assert "give one of --delay and --at" in both.stderr
    assert "not a duration" in _cli("reschedule", "abc", "--delay", "soon").stderr
