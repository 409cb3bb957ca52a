from __future__ import annotations

import os
import subprocess
import sys

import pytest
from confluent_kafka.admin import NewTopic

from delayservice.kafka import topics

pytestmark = pytest.mark.kafka


def test_create_is_idempotent_and_uses_log_append_time(testbed):
    settings = testbed.settings(levels="1s,1h")
    first = topics.create(testbed.admin, settings)
    assert [outcome for _spec, outcome in first] == ["created"] * 3
    again = topics.create(testbed.admin, settings)
    assert [outcome for _spec, outcome in again] == ["exists"] * 3
    statuses = topics.describe(testbed.admin, settings)
    assert all(s.exists and not s.problems for s in statuses)
    level_1h = next(s for s in statuses if s.spec.name.endswith("-2"))
    assert level_1h.config["message.timestamp.type"] == "LogAppendTime"
    assert int(level_1h.config["retention.ms"]) >= topics.min_retention_ms(3_600_000)


def test_describe_says_plainly_what_is_wrong(testbed):
    settings = testbed.settings(levels="1s,2s,3s")
    prefix = settings.topic_prefix
    testbed.admin.create_topics(
        [
            NewTopic(f"{prefix}1", 1, 1, config={"message.timestamp.type": "CreateTime"}),
            NewTopic(
                f"{prefix}2",
                1,
                1,
                config={"message.timestamp.type": "LogAppendTime", "retention.ms": "60000"},
            ),
        ]
    )[f"{prefix}1"].result(30)
    testbed.wait_for(
        lambda: (
            len(testbed.admin.list_topics(timeout=5).topics.get(f"{prefix}2").partitions) == 1
            if testbed.admin.list_topics(timeout=5).topics.get(f"{prefix}2")
            else False
        ),
        30,
        "the second topic",
    )
    problems = "\n".join(topics.problems_summary(topics.describe(testbed.admin, settings)))
    assert f"{prefix}1: message.timestamp.type is CreateTime, needs LogAppendTime" in problems
    assert f"{prefix}2: retention.ms is 1m, needs at least 1d" in problems
    assert f"{prefix}3: missing" in problems
    assert f"{settings.dead_letter_topic}: missing" in problems

    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYSERVICE_")}
    cli = [sys.executable, "-m", "delayservice", "topics", "describe", "-b", testbed.bootstrap]
    env.update(
        {
            "DELAYSERVICE_LEVELS": settings.levels,
            "DELAYSERVICE_TOPIC_PREFIX": prefix,
            "DELAYSERVICE_DEAD_LETTER_TOPIC": settings.dead_letter_topic,
        }
    )
    result = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "CreateTime" in result.stdout
    assert "missing" in result.stdout


def test_the_daemon_refuses_misconfigured_topics_with_exit_2(testbed):
    settings = testbed.settings(levels="1s")
    testbed.create_topic(f"{settings.topic_prefix}1", 1, {"message.timestamp.type": "CreateTime"})
    testbed.create_topic(settings.dead_letter_topic, 1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYSERVICE_")}
    env.update(
        {
            "DELAYSERVICE_BOOTSTRAP_SERVERS": testbed.bootstrap,
            "DELAYSERVICE_LEVELS": "1s",
            "DELAYSERVICE_TOPIC_PREFIX": settings.topic_prefix,
            "DELAYSERVICE_METRICS_PORT": "0",
            "DELAYSERVICE_DEAD_LETTER_TOPIC": settings.dead_letter_topic,
        }
    )
    result = subprocess.run(
        [sys.executable, "-m", "delayservice", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "needs LogAppendTime" in result.stderr
