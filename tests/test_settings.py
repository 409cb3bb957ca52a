import logging
import os
import socket

import pytest

from delayservice.errors import ConfigError
from delayservice.levels import DEFAULT_LEVELS
from delayservice.settings_loading import load_settings


def test_defaults_are_valid():
    settings = load_settings()
    assert settings.level_set().spec().startswith("5s,10s")
    assert settings.scheduler == "heap"


def test_environment_beats_the_file_and_arguments_beat_both(tmp_path, monkeypatch):
    config = tmp_path / "d.toml"
    config.write_text(
        'levels = "1s,2s"\ngroup_id = "from-file"\npartitions = 5\n'
        '[kafka]\n"security.protocol" = "PLAINTEXT"\n'
    )
    monkeypatch.setenv("DELAYSERVICE_GROUP_ID", "from-env")
    settings = load_settings(config, partitions=7)
    assert settings.levels == "1s,2s"
    assert settings.group_id == "from-env"
    assert settings.partitions == 7
    assert settings.kafka == {"security.protocol": "PLAINTEXT"}


def test_a_misspelt_environment_variable_is_an_error(monkeypatch):
    monkeypatch.setenv("DELAYSERVICE_LEVLES", "1s")
    with pytest.raises(ConfigError, match="DELAYSERVICE_LEVLES"):
        load_settings()


def test_an_unknown_key_in_the_file_is_an_error(tmp_path):
    config = tmp_path / "d.toml"
    config.write_text("pause_hihg_water = 5\n")
    with pytest.raises(ConfigError, match="pause_hihg_water: unknown setting"):
        load_settings(config)


@pytest.mark.parametrize(
    ("overrides", "setting"),
    [
        ({"levels": "1s,x"}, "levels"),
        ({"pause_low_water": 10, "pause_high_water": 10}, "pause_low_water"),
        ({"metrics_port": 70000}, "metrics_port"),
        ({"scheduler": "tree"}, "scheduler"),
    ],
)
def test_bad_values_name_the_setting(overrides, setting):
    with pytest.raises(ConfigError, match=setting):
        load_settings(**overrides)


def test_broken_toml_and_missing_file(tmp_path):
    broken = tmp_path / "b.toml"
    broken.write_text("levels = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(broken)
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")


def test_delayservice_config_names_the_file_every_caller_reads(tmp_path, monkeypatch):
    """The daemon's `--config` falls back to DELAYSERVICE_CONFIG; so does everything that
    loads settings without naming a file (the producer), and the environment still wins."""
    config = tmp_path / "d.toml"
    config.write_text('levels = "1s,3s"\ntopic_prefix = "own_"\n')
    monkeypatch.setenv("DELAYSERVICE_CONFIG", str(config))
    assert load_settings().levels == "1s,3s"
    monkeypatch.setenv("DELAYSERVICE_TOPIC_PREFIX", "env_")
    assert load_settings().topic_prefix == "env_"
    other = tmp_path / "other.toml"
    other.write_text('levels = "2s"\n')
    assert load_settings(other).levels == "2s", "a file given wins over the variable"
    monkeypatch.setenv("DELAYSERVICE_CONFIG", "")
    assert load_settings().levels == DEFAULT_LEVELS, "an empty variable names no file"


def test_the_shipped_example_config_loads():
    from pathlib import Path

    example = Path(__file__).parent.parent / "config" / "delayservice.toml"
    settings = load_settings(example)
    assert settings.level_set().max_delay_ms == 7_200_000


@pytest.mark.parametrize(
    "name",
    [
        "DELAYSERVICE_CONFIG",
        "DELAYSERVICE_CHECK_URL",
        "DELAYSERVICE_PURE_PYTHON",
        "DELAYSERVICE_AUDIT_GRACE",
        "DELAYSERVICE_TEST_BOOTSTRAP",
    ],
)
def test_command_variables_are_not_mistaken_for_settings(monkeypatch, tmp_path, name):
    """These belong to the CLI and the test harness; the daemon must start with them set."""
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    monkeypatch.setenv(name, str(empty) if name == "DELAYSERVICE_CONFIG" else "x")
    monkeypatch.setenv("DELAYSERVICE_GROUP_ID", "from-env")
    assert load_settings().group_id == "from-env"


def test_a_variable_that_only_starts_like_a_command_variable_is_still_checked(monkeypatch):
    """The exemption is by prefix; a misspelt setting next to it is still an error."""
    monkeypatch.setenv("DELAYSERVICE_CHECK_URL", "x")
    monkeypatch.setenv("DELAYSERVICE_GROUPID", "x")
    with pytest.raises(ConfigError, match="DELAYSERVICE_GROUPID"):
        load_settings()


def test_instance_name_defaults_to_the_host_name_and_may_be_set(monkeypatch):
    monkeypatch.delenv("DELAYSERVICE_INSTANCE_NAME", raising=False)
    assert load_settings().instance_name == socket.gethostname()
    monkeypatch.setenv("DELAYSERVICE_INSTANCE_NAME", "broker-7")
    assert load_settings().instance_name == "broker-7"


def test_an_empty_instance_name_is_an_error(monkeypatch):
    """An empty name would give every instance the same static member id."""
    with pytest.raises(ConfigError, match="instance_name"):
        load_settings(instance_name="")
    monkeypatch.setenv("DELAYSERVICE_INSTANCE_NAME", "")
    with pytest.raises(ConfigError, match="instance_name"):
        load_settings()


@pytest.mark.parametrize(
    ("overrides", "setting"),
    [
        ({"session_timeout_s": 0.5}, "session_timeout_s"),
        ({"session_timeout_s": 301}, "session_timeout_s"),
        ({"retry_give_up_s": 0}, "retry_give_up_s"),
        ({"retry_give_up_s": -1}, "retry_give_up_s"),
        ({"max_buffered_bytes": 1024 * 1024 - 1}, "max_buffered_bytes"),
        ({"instance_name": "x" * 201}, "instance_name"),
    ],
)
def test_new_settings_out_of_bounds_name_the_setting(overrides, setting):
    with pytest.raises(ConfigError, match=setting):
        load_settings(**overrides)


@pytest.mark.parametrize(
    ("overrides", "attribute", "expected"),
    [
        ({"session_timeout_s": 1}, "session_timeout_s", 1.0),
        ({"session_timeout_s": 300}, "session_timeout_s", 300.0),
        ({"retry_give_up_s": 0.5}, "retry_give_up_s", 0.5),
        ({"max_buffered_bytes": 1024 * 1024}, "max_buffered_bytes", 1024 * 1024),
    ],
)
def test_new_settings_accept_their_bounds(overrides, attribute, expected):
    assert getattr(load_settings(**overrides), attribute) == expected


def test_new_settings_defaults_and_environment(monkeypatch):
    for name in ("SESSION_TIMEOUT_S", "RETRY_GIVE_UP_S", "MAX_BUFFERED_BYTES"):
        monkeypatch.delenv(f"DELAYSERVICE_{name}", raising=False)
    defaults = load_settings()
    assert defaults.session_timeout_s == 10.0
    assert defaults.retry_give_up_s == 300.0
    assert defaults.max_buffered_bytes == 768 * 1024 * 1024
    monkeypatch.setenv("DELAYSERVICE_SESSION_TIMEOUT_S", "45")
    monkeypatch.setenv("DELAYSERVICE_MAX_BUFFERED_BYTES", str(64 * 1024 * 1024))
    from_env = load_settings()
    assert from_env.session_timeout_s == 45.0
    assert from_env.max_buffered_bytes == 64 * 1024 * 1024


def test_a_near_miss_of_a_command_variable_is_still_an_error(monkeypatch):
    monkeypatch.setenv("DELAYSERVICE_CONFIGS", "x")
    with pytest.raises(ConfigError, match="DELAYSERVICE_CONFIGS"):
        load_settings()


def test_settings_env_makes_a_new_process_load_the_same_settings(monkeypatch):
    from delayservice.settings_loading import settings_env

    monkeypatch.setenv("DELAYSERVICE_LEVELS", "9s")  # the caller's own variables go
    original = load_settings(
        levels="1s,2s", kafka={"security.protocol": "PLAINTEXT"}, retry_backoff_s=0.25
    )
    env = settings_env(original, instance_name="other", metrics_port=0)
    assert env["DELAYSERVICE_INSTANCE_NAME"] == "other"
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    loaded = load_settings()
    assert loaded == original.model_copy(update={"instance_name": "other", "metrics_port": 0})


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("host one", "ASCII letters"),
        ("h\x00", "ASCII letters"),
        ("\u00e9", "ASCII letters"),
        ("x" * 200, "249"),  # with a 60-character topic prefix
    ],
)
def test_an_instance_name_the_broker_would_refuse_is_a_configuration_error(name, problem):
    """Per level, a member is `{instance_name}-{level topic}`."""
    with pytest.raises(ConfigError, match=f"instance_name.*{problem}"):
        load_settings(instance_name=name, topic_prefix="p" * 60, level_workers="per-level")


def test_worker_processes_count_in_the_instance_id_limit():
    prefix = "p" * 50  # level topic "ppp...1", 51 characters
    name = "x" * (249 - len("-p1-") - 51)
    per_level = {"levels": "1s", "topic_prefix": prefix, "level_workers": "per-level"}
    assert load_settings(instance_name=name, **per_level).processes == 1
    load_settings(instance_name=name, processes=2, **per_level)  # fits
    with pytest.raises(ConfigError, match=r"instance_name.*249"):  # "-p10" is one too many
        load_settings(instance_name=name, processes=11, **per_level)


def test_the_shared_workers_member_id_does_not_grow_with_the_level_topics():
    """One worker for all levels joins as `{instance_name}-p{k}-levels`, whatever the
    topics: the longest name and the most processes fit where per level they do not."""
    longest = {"instance_name": "x" * 200, "topic_prefix": "p" * 60, "processes": 64}
    assert load_settings(**longest).level_workers == "shared"
    with pytest.raises(ConfigError, match=r"instance_name.*249"):
        load_settings(level_workers="per-level", **longest)


@pytest.mark.parametrize("count", [0, -1, 65])
def test_a_processes_count_out_of_range_is_refused(count):
    with pytest.raises(ConfigError, match="processes"):
        load_settings(processes=count)


def test_precise_settings_defaults(monkeypatch):
    from pathlib import Path

    for name in list(os.environ):
        if name.startswith("DELAYSERVICE_"):
            monkeypatch.delenv(name)
    settings = load_settings()
    assert settings.precise is False
    assert settings.precise_topic == "delay_precise"
    assert settings.precise_done_topic == "delay_precise_done"
    assert settings.data_dir == Path("/var/lib/delayservice")
    assert settings.replicas == 1
    assert settings.max_delay == "366d"
    assert settings.max_delay_ms == 366 * 86_400_000
    assert (settings.precise_members, settings.precise_member) == (1, 0)
    assert settings.takeover_delay_s == 30.0
    assert settings.precise_lookahead_s == 5.0


def test_precise_settings_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DELAYSERVICE_PRECISE", "true")
    monkeypatch.setenv("DELAYSERVICE_PRECISE_TOPIC", "timers")
    monkeypatch.setenv("DELAYSERVICE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("DELAYSERVICE_MAX_DELAY", "90m")
    monkeypatch.setenv("DELAYSERVICE_REPLICAS", "2")
    monkeypatch.setenv("DELAYSERVICE_PRECISE_MEMBERS", "3")
    monkeypatch.setenv("DELAYSERVICE_PRECISE_MEMBER", "2")
    settings = load_settings()
    assert settings.precise is True
    assert settings.precise_done_topic == "timers_done"
    assert settings.data_dir == tmp_path
    assert settings.max_delay_ms == 5_400_000
    assert (settings.replicas, settings.precise_members, settings.precise_member) == (2, 3, 2)


@pytest.mark.parametrize("value", ["forever", "7 days", "", "-1d", "1.5h"])
def test_a_max_delay_that_is_not_a_duration_names_the_setting(value):
    with pytest.raises(ConfigError, match=r"invalid setting max_delay: .*not a duration"):
        load_settings(max_delay=value)


def test_a_max_delay_of_zero_is_refused():
    with pytest.raises(ConfigError, match="max_delay: must be longer than 0"):
        load_settings(max_delay="0s")


@pytest.mark.parametrize(
    ("overrides", "setting"),
    [
        ({"replicas": 0}, "replicas"),
        ({"replicas": 3, "precise_members": 3}, "replicas"),
        ({"precise_members": 0}, "precise_members"),
        ({"precise_members": 65}, "precise_members"),
        ({"precise_member": -1}, "precise_member"),
        ({"takeover_delay_s": 0}, "takeover_delay_s"),
        ({"precise_lookahead_s": 0}, "precise_lookahead_s"),
        ({"precise_lookahead_s": 3601}, "precise_lookahead_s"),
    ],
)
def test_precise_settings_out_of_bounds_name_the_setting(overrides, setting):
    with pytest.raises(ConfigError, match=f"invalid setting {setting}:"):
        load_settings(**overrides)


@pytest.mark.parametrize(
    ("overrides", "attribute", "expected"),
    [
        ({"replicas": 2, "precise_members": 2}, "replicas", 2),
        ({"precise_members": 64, "precise_member": 63}, "precise_member", 63),
        ({"precise_lookahead_s": 3600}, "precise_lookahead_s", 3600.0),
        ({"takeover_delay_s": 0.5}, "takeover_delay_s", 0.5),
        ({"max_delay": "500ms"}, "max_delay_ms", 500),
    ],
)
def test_precise_settings_accept_their_bounds(overrides, attribute, expected):
    assert getattr(load_settings(**overrides), attribute) == expected


@pytest.mark.parametrize(("member", "members"), [(1, 1), (3, 3), (64, 64)])
def test_the_precise_member_must_be_below_the_member_count(member, members):
    with pytest.raises(ConfigError, match=f"precise_member: is {member}, must be below"):
        load_settings(precise_member=member, precise_members=members)


def test_two_replicas_need_two_members():
    """Both copies on one instance would not survive the loss of its disk."""
    with pytest.raises(ConfigError, match="replicas: 2 copies need at least 2 instances"):
        load_settings(replicas=2)
    assert load_settings(replicas=2, precise_members=2).replicas == 2


def test_precise_mode_runs_in_one_process():
    """Worker processes would all be the same member over one data directory."""
    with pytest.raises(ConfigError, match="processes: precise mode runs in one process"):
        load_settings(precise=True, processes=2)
    assert load_settings(precise=False, processes=2).processes == 2


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "empty"),
        ("has space", "characters other than"),
        ("t\u00e9", "characters other than"),
        (".", "not a legal topic name"),
        ("__consumer_offsets", "internal Kafka topic"),
        ("x" * 250, "Kafka allows 249"),
        ("x" * 245, "Kafka allows 249"),  # fine alone, too long with "_far_done"
    ],
)
def test_a_precise_topic_kafka_would_refuse_is_a_configuration_error(name, problem):
    with pytest.raises(ConfigError, match=f"invalid setting precise_topic: .*{problem}"):
        load_settings(precise_topic=name)


def test_the_longest_legal_precise_topic_leaves_room_for_its_far_done_topic():
    name = "x" * (249 - len("_far_done"))
    assert len(load_settings(precise_topic=name).precise_far_done_topic) == 249


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"precise_topic": "delay_topic_3"}, "delay_topic_3 is also level 30s's topic"),
        ({"precise_topic": "dlq"}, "dlq is also the dead-letter topic"),
        ({"precise_topic": "p", "dead_letter_topic": "p_done"}, "p_done is also the dead-letter"),
    ],
)
def test_the_precise_topics_must_not_be_level_or_dead_letter_topics(overrides, problem):
    values = {"dead_letter_topic": "dlq", **overrides}
    with pytest.raises(ConfigError, match=f"invalid setting precise_topic: {problem}"):
        load_settings(**values)


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"markers_topic": "delay_topic_3"}, "delay_topic_3 is also level 30s's topic"),
        ({"markers_topic": "dlq"}, "dlq is also the dead-letter topic"),
        ({"markers_topic": "delay_precise"}, "delay_precise is also a precise-mode topic"),
        ({"markers_topic": "m", "dead_letter_topic": "m_outcomes"}, "m_outcomes is also the"),
        ({"markers_topic": "a b"}, "'a b': .*characters other than"),
        ({"markers_topic": "x" * 245}, ".*_outcomes.: .*Kafka allows 249"),  # with "_outcomes"
    ],
)
def test_the_markers_topics_are_legal_and_no_other_kind_of_topic(overrides, problem):
    values = {"dead_letter_topic": "dlq", **overrides}
    with pytest.raises(ConfigError, match=f"invalid setting markers_topic: {problem}"):
        load_settings(**values)


def test_setting_the_scheduler_warns_that_it_is_ignored(caplog):
    with caplog.at_level(logging.WARNING, logger="delayservice.settings"):
        load_settings(scheduler="wheel")
    messages = [r.getMessage() for r in caplog.records]
    assert any("scheduler" in m and "ignored" in m for m in messages)


def test_leaving_the_scheduler_alone_warns_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="delayservice.settings"):
        load_settings()
    assert not [r for r in caplog.records if r.name == "delayservice.settings"]


def test_settings_load_without_the_kafka_package():
    """Settings are read by the producer SDK and the CLI before any client exists; they
    must not drag in the Kafka tooling (or a cycle through it)."""
    import subprocess
    import sys

    probe = (
        "import sys, delayservice.settings_loading; "
        "print(sorted(m for m in sys.modules if m.startswith('delayservice.kafka')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def test_a_new_process_gets_a_deprecated_setting_only_when_it_was_set():
    from delayservice.settings_loading import settings_env

    assert "DELAYSERVICE_SCHEDULER" not in settings_env(load_settings())
    assert settings_env(load_settings(scheduler="wheel"))["DELAYSERVICE_SCHEDULER"] == "wheel"


def test_precise_mode_takes_exactly_once_with_one_copy_or_two():
    """The same setting as for levels. Two copies start too (they worked before, at
    least once); the daemon says at start what a takeover may cost."""
    settings = load_settings(precise=True, guarantee="exactly-once")
    assert (settings.precise, settings.guarantee) == (True, "exactly-once")
    two = load_settings(precise=True, guarantee="exactly-once", replicas=2, precise_members=2)
    assert (two.replicas, two.guarantee) == (2, "exactly-once")
