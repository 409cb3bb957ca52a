from __future__ import annotations

import os
import subprocess
import sys

import pytest
from confluent_kafka.admin import NewTopic

from delayservice.kafka import topics
from delayservice.settings_loading import load_settings


@pytest.mark.kafka
def test_create_is_idempotent_and_uses_log_append_time(testbed):
    settings = testbed.settings(levels="1s,1h")
    first = topics.create(testbed.admin, settings)
    roles = ["level 1s", "level 1h", "dead letters", "level markers", "level outcomes"]
    assert [(spec.role, outcome) for spec, outcome in first] == [(r, "created") for r in roles]
    again = topics.create(testbed.admin, settings)
    assert [outcome for _spec, outcome in again] == ["exists"] * len(roles)
    statuses = topics.describe(testbed.admin, settings)
    assert all(s.exists and not s.problems for s in statuses)
    level_1h = next(s for s in statuses if s.spec.name.endswith("-2"))
    assert level_1h.config["message.timestamp.type"] == "LogAppendTime"
    assert int(level_1h.config["retention.ms"]) >= topics.min_retention_ms(3_600_000)


@pytest.mark.kafka
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


@pytest.mark.kafka
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


def test_precise_topics_are_wanted_only_with_precise_on():
    off = load_settings(levels="1s,1h")
    assert [s.role for s in topics.wanted(off)] == [
        "level 1s",
        "level 1h",
        "dead letters",
        "level markers",
        "level outcomes",
    ]
    on = load_settings(levels="1s,1h", precise=True, partitions=6, replication_factor=2)
    specs = {s.role: s for s in topics.wanted(on)}
    precise, done = specs["precise"], specs["precise done"]
    assert (precise.name, precise.partitions, precise.replication) == ("delay_precise", 6, 2)
    assert precise.config["message.timestamp.type"] == "LogAppendTime"
    assert precise.min_retention_ms == topics.min_retention_ms(0) == 24 * topics.HOUR_MS
    assert (done.name, done.partitions, done.replication) == ("delay_precise_done", 1, 2)
    assert done.config == {"cleanup.policy": "compact"}
    assert done.compacted
    assert done.min_retention_ms is None


def test_the_markers_topic_is_partitioned_like_the_levels_and_kept_as_long_as_the_top_level():
    """A marker goes to its level partition's markers partition, and counts by its
    append time; a restarted daemon reads it again for every message still waiting."""
    settings = load_settings(levels="1s,2h", retention_hours=1.0, partitions=6)
    specs = {s.role: s for s in topics.wanted(settings)}
    markers, outcomes = specs["level markers"], specs["level outcomes"]
    assert (markers.name, markers.partitions) == ("delay_markers", 6)
    assert markers.config["message.timestamp.type"] == "LogAppendTime"
    assert markers.min_retention_ms == topics.min_retention_ms(2 * topics.HOUR_MS)
    assert markers.config["retention.ms"] == str(topics.min_retention_ms(2 * topics.HOUR_MS))
    assert (outcomes.name, outcomes.partitions) == ("delay_markers_outcomes", 1)


def test_a_markers_topic_narrower_than_a_level_topic_is_advised_not_refused():
    settings = load_settings(levels="1s,2h", partitions=6)
    statuses = [
        topics.TopicStatus(spec, True, partitions=1 if spec.role == "level markers" else 6)
        for spec in topics.wanted(settings)
    ]
    assert topics.problems_summary(statuses) == []
    (line,) = topics.advice(statuses, settings)
    assert line.startswith("delay_markers has 1 partition(s) and a level topic has 6")
    wide = [topics.TopicStatus(s.spec, True, partitions=6) for s in statuses]
    assert topics.advice(wide, settings) == []


@pytest.mark.parametrize(
    ("retention_hours", "expected_ms"), [(168.0, 168 * 3_600_000), (1.0, 24 * 3_600_000)]
)
def test_the_precise_topic_keeps_an_unread_backlog_at_least_a_day(retention_hours, expected_ms):
    """Its records wait in the wheel, not in Kafka: a longer max_delay needs no more."""
    settings = load_settings(precise=True, retention_hours=retention_hours, max_delay="30d")
    (precise,) = [s for s in topics.wanted(settings) if s.role == "precise"]
    assert precise.config["retention.ms"] == str(expected_ms)


@pytest.mark.parametrize(
    ("config", "problems"),
    [
        ({"cleanup.policy": "compact"}, []),
        (
            {"cleanup.policy": "delete"},
            ["cleanup.policy is delete, needs compact (progress reports would be deleted by age)"],
        ),
        ({"cleanup.policy": "compact,delete"}, ["cleanup.policy is compact,delete, needs compact"]),
    ],
)
def test_the_done_topic_must_be_compacted(config, problems):
    settings = load_settings(precise=True)
    (done,) = [s for s in topics.wanted(settings) if s.role == "precise done"]
    found = topics._problems(topics.TopicStatus(done, True, 1, config))
    assert len(found) == len(problems)
    assert all(f.startswith(p) for f, p in zip(found, problems, strict=True))


@pytest.mark.kafka
def test_create_with_precise_on_adds_the_precise_and_done_topics(testbed):
    settings = testbed.settings(
        levels="1s", precise=True, precise_topic=f"dp-{testbed.tag}", partitions=4
    )
    outcomes = {spec.role: outcome for spec, outcome in topics.create(testbed.admin, settings)}
    assert outcomes == dict.fromkeys(
        [
            "level 1s",
            "dead letters",
            "level markers",
            "level outcomes",
            "precise",
            "precise done",
            "precise far",
            "precise far done",
            "precise outcomes",
        ],
        "created",
    )
    testbed.wait_for(
        lambda: all(s.exists for s in topics.describe(testbed.admin, settings, timeout=5)),
        30,
        "the new topics in the metadata",
    )
    statuses = {s.spec.role: s for s in topics.describe(testbed.admin, settings)}
    assert topics.problems_summary(list(statuses.values())) == []
    precise, done = statuses["precise"], statuses["precise done"]
    assert (precise.spec.name, precise.partitions) == (settings.precise_topic, 4)
    assert precise.config["message.timestamp.type"] == "LogAppendTime"
    assert int(precise.config["retention.ms"]) >= 24 * topics.HOUR_MS
    assert (done.spec.name, done.partitions) == (settings.precise_done_topic, 1)
    assert done.config["cleanup.policy"] == "compact"
    outcomes_topic = statuses["precise outcomes"]
    assert (outcomes_topic.spec.name, outcomes_topic.partitions) == (
        settings.precise_outcomes_topic,
        1,
    )
    again = topics.create(testbed.admin, settings)
    far = statuses["precise far"]
    assert (far.spec.name, far.partitions) == (settings.precise_far_topic, 4)
    assert far.config["message.timestamp.type"] == "LogAppendTime"
    assert statuses["precise far done"].config["cleanup.policy"] == "compact"
    assert [outcome for _spec, outcome in again] == ["exists"] * len(outcomes)


@pytest.mark.kafka
def test_describe_says_what_is_wrong_with_the_precise_topics(testbed):
    settings = testbed.settings(levels="1s", precise=True, precise_topic=f"dp-{testbed.tag}")
    testbed.create_topic(settings.precise_topic, 2, {"message.timestamp.type": "CreateTime"})
    testbed.create_topic(settings.precise_done_topic, 1, {"cleanup.policy": "delete"})
    testbed.wait_for(
        lambda: sum(s.exists for s in topics.describe(testbed.admin, settings, timeout=5)) == 2,
        30,
        "the precise topics in the metadata",
    )
    problems = "\n".join(topics.problems_summary(topics.describe(testbed.admin, settings)))
    assert (
        f"{settings.precise_topic}: message.timestamp.type is CreateTime, needs LogAppendTime"
        in problems
    )
    assert f"{settings.precise_done_topic}: cleanup.policy is delete, needs compact" in problems
    assert f"{settings.topic_prefix}1: missing" in problems


def test_create_returns_once_the_topics_are_in_the_brokers_metadata():
    """A topic reaches the brokers' metadata a moment after the controller accepts it;
    `create` waits for it, so a client made right after finds it (a producer made at
    once refused a cancel, "create it with topics create")."""
    from types import SimpleNamespace

    from delayservice.errors import DelayServiceError

    answers = iter([{}, {"t": SimpleNamespace(error=None, partitions={})}])
    ready = {"t": SimpleNamespace(error=None, partitions={0: SimpleNamespace(leader=1)})}
    asked: list[float] = []

    class Admin:
        def list_topics(self, timeout: float = -1) -> object:
            asked.append(timeout)
            return SimpleNamespace(topics=next(answers, ready))

    topics.listed(Admin(), ["t"], timeout=5)  # type: ignore[arg-type]
    assert len(asked) == 3  # not listed, listed without partitions, listed

    class Never:
        def list_topics(self, timeout: float = -1) -> object:
            return SimpleNamespace(topics={})

    with pytest.raises(DelayServiceError, match=r"not in the brokers' metadata after 0\.2s: t"):
        topics.listed(Never(), ["t"], timeout=0.2)  # type: ignore[arg-type]


def test_create_waits_through_a_failed_listing_and_says_the_last_error():
    """The topics were made: a listing that fails is asked again until the deadline,
    and a wait that ends names the last error, not a raw client exception."""
    from types import SimpleNamespace

    from confluent_kafka import KafkaError, KafkaException

    from delayservice.errors import DelayServiceError

    ready = {"t": SimpleNamespace(error=None, partitions={0: SimpleNamespace(leader=1)})}
    calls: list[int] = []

    class Flaky:
        def list_topics(self, timeout: float = -1) -> object:
            calls.append(1)
            if len(calls) == 1:
                raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker away"))
            return SimpleNamespace(topics=ready)

    topics.listed(Flaky(), ["t"], timeout=5)  # type: ignore[arg-type]
    assert len(calls) == 2

    class Down:
        def list_topics(self, timeout: float = -1) -> object:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker away"))

    with pytest.raises(DelayServiceError, match=r"after 0\.2s: t \(last: broker away\)"):
        topics.listed(Down(), ["t"], timeout=0.2)  # type: ignore[arg-type]
