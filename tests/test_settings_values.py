"""Any value, from the environment or the file, gives valid settings or one line naming
the setting: never another exception, so `delayservice run` never ends in a traceback
(exit 1, which systemd's `RestartPreventExitStatus=2` would restart in a loop)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from delayservice.cli.app import app
from delayservice.errors import ConfigError
from delayservice.settings import ENV_PREFIX, Settings
from delayservice.settings_loading import load_settings, settings_env
from tests.settings_environment import only_these_settings

NAMES = sorted(Settings.model_fields)
ONE_LINE = re.compile(r"invalid setting ([\w.-]+|--config|kafka, consumer or producer): [^\n]+")
# What an environment variable can hold: no NUL, no lone surrogates (os.environ refuses both).
ENV_TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"))
# What a TOML string can hold: any Unicode scalar value, NUL included.
TOML_TEXT = st.text(st.characters(exclude_categories=("Cs",)))
# Values near the ones that parse, so that the validators past the first are reached.
NEAR_MISSES = st.sampled_from(
    ["", " ", "0", "-1", "1", "1.5", "1e300", "nan", "inf", "-inf", "true", "{}", "[]",
     '{"a": "b"}', '{"a": 1}', "null", "5s", "0s", "1s,1s", "bad topic ", "a" * 300,
     "host:9092", "host:9092,", "security.protocol=SSL", "..", "__consumer_offsets"]
)  # fmt: skip
VALUES = st.one_of(NEAR_MISSES, ENV_TEXT)
CASES = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def toml_string(text: str) -> str:
    """`text` as a TOML basic string: printable ASCII as is, the rest as \\u escapes."""
    out = []
    for char in text:
        if char in '"\\' or not (" " <= char <= "~"):
            out.append(f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def check_outcome(load: object) -> None:
    """Valid settings that every part of the service can use, or one ConfigError line
    naming a setting."""
    assert callable(load)
    try:
        current = load()
    except ConfigError as exc:
        message = str(exc)
        assert ONE_LINE.fullmatch(message), message
        name = message.removeprefix("invalid setting ").split(":", 1)[0].split(".", 1)[0]
        assert name in {*Settings.model_fields, "--config"} or name.startswith("kafka,"), message
        return
    assert isinstance(current, Settings)
    levels = current.level_set()
    assert current.dead_letter_topic not in {level.topic for level in levels}
    assert len(current.internal_topics()) == (
        len(levels) + 1 + len(current.precise_topics()) + len(current.marker_topics())
    )
    assert current.bootstrap_servers
    assert 0 < current.commit_interval() <= threading.TIMEOUT_MAX
    assert current.retry_backoff_s <= current.retry_backoff_max_s <= threading.TIMEOUT_MAX
    assert current.shutdown_timeout_s <= threading.TIMEOUT_MAX
    assert current.max_delay_ms > 0
    assert current.precise_far_after_ms > 0
    repr(current)
    # A new process (a worker, a test daemon) loads exactly these settings.
    child = {k: v for k, v in settings_env(current).items() if k.startswith(ENV_PREFIX)}
    with only_these_settings(child):
        assert load_settings() == current


@pytest.mark.parametrize("name", NAMES)
@CASES
@given(value=VALUES)
def test_any_environment_value_gives_settings_or_one_line(name, value):
    with only_these_settings({f"{ENV_PREFIX}{name.upper()}": value}):
        check_outcome(load_settings)


@pytest.mark.parametrize("name", NAMES)
@CASES
@given(value=st.one_of(NEAR_MISSES, TOML_TEXT))
def test_any_file_value_gives_settings_or_one_line(name, value, tmp_path_factory):
    path = tmp_path_factory.mktemp("toml") / "delayservice.toml"
    path.write_text(f"{name} = {toml_string(value)}\n")
    with only_these_settings({}):
        check_outcome(lambda: load_settings(path))


@CASES
@given(text=st.one_of(NEAR_MISSES, ENV_TEXT))
def test_any_settings_file_text_gives_settings_or_one_line(text, tmp_path_factory):
    path = tmp_path_factory.mktemp("toml") / "delayservice.toml"
    path.write_text(text)
    with only_these_settings({}):
        check_outcome(lambda: load_settings(path))


@CASES
@given(name=st.sampled_from(NAMES), value=VALUES)
def test_the_settings_command_exits_0_or_2_with_one_line(name, value):
    result = CliRunner().invoke(app, ["settings"], env={f"{ENV_PREFIX}{name.upper()}": value})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    if result.exit_code == 0:
        assert f"{name} = " in result.output
    else:
        assert result.exit_code == 2, result.output
        (line,) = result.output.strip().splitlines()
        assert ONE_LINE.fullmatch(line.removeprefix("delayservice: ")), line


def test_a_settings_file_that_cannot_be_read_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        load_settings(tmp_path)  # a directory
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b'levels = "\xff"\n')
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(binary)


def run_daemon(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    return subprocess.run(
        [sys.executable, "-m", "delayservice", "run"],
        env={**clean, "DELAYSERVICE_BOOTSTRAP_SERVERS": "127.0.0.1:1", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("env", "setting"),
    [
        ({"DELAYSERVICE_KAFKA": "security.protocol=SSL"}, "kafka"),
        ({"DELAYSERVICE_BOOTSTRAP_SERVERS": ""}, "bootstrap_servers"),
        ({"DELAYSERVICE_TOPIC_PREFIX": "bad topic "}, "topic_prefix"),
        ({"DELAYSERVICE_DATA_DIR": ""}, "data_dir"),
        ({"DELAYSERVICE_DEAD_LETTER_TOPIC": "delay_topic_1"}, "dead_letter_topic"),
        ({"DELAYSERVICE_RETRY_BACKOFF_S": "5", "DELAYSERVICE_RETRY_BACKOFF_MAX_S": "2"},
         "retry_backoff_max_s"),
        ({"DELAYSERVICE_RETENTION_HOURS": "inf"}, "retention_hours"),
        ({"DELAYSERVICE_SHUTDOWN_TIMEOUT_S": "1e300"}, "shutdown_timeout_s"),
        ({"DELAYSERVICE_KAFKA": '{"bogus.key": "1"}'}, "kafka, consumer or producer"),
        ({"DELAYSERVICE_PRODUCER": '{"request.required.acks": "1"}'}, "producer"),
    ],
    ids=lambda v: v if isinstance(v, str) else ",".join(v),
)  # fmt: skip
def test_the_daemon_stops_on_a_bad_setting_with_one_line_and_exit_2(env, setting):
    result = run_daemon(env)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"delayservice: invalid setting {setting}: "), line
    assert "Traceback" not in result.stderr


def test_the_shipped_config_changes_no_default():
    """Every value config/delayservice.toml sets is the default: a file copied as it is
    must not change behaviour unseen (commit_interval_s = 1.0 once overrode
    exactly-once's 0.1 s)."""
    import tomllib

    path = Path(__file__).parents[1] / "config" / "delayservice.toml"
    values = tomllib.loads(path.read_text())
    shipped = load_settings(path)
    defaults = load_settings()
    changed = {
        name: (getattr(shipped, name), getattr(defaults, name))
        for name in values
        if getattr(shipped, name) != getattr(defaults, name)
    }
    assert changed == {}, "the shipped file changes these defaults (shipped, default)"
    assert "commit_interval_s" not in values, "its default depends on guarantee"
