"""One convention across the CLI, checked over every command in one table: `--json`
wherever a command prints data; `--at` (with `--deliver-at` as the same flag) for an
absolute time; the SDK's duration grammar, bare seconds included; errors that name
flags, in one line with exit 2; enums in any case; one meaning per outcome word."""

from __future__ import annotations

import subprocess
from typing import Any, NamedTuple

import pytest
import typer.main

from delayservice.cli.app import app
from delayservice.cli.common import delivery_time
from delayservice.markers.replies import MarkerReply
from tests.cli.test_commands import _cli


class Convention(NamedTuple):
    prints_data: bool
    """Its output is data a script may read: it must take --json."""
    takes_time: bool
    """It takes a delivery time: --delay and --at (alias --deliver-at)."""
    args: tuple[str, ...] = ()
    """Arguments that get past its required ones, so a bad flag is what fails."""


TABLE: dict[str, Convention] = {
    "run": Convention(prints_data=False, takes_time=False),
    "send": Convention(prints_data=True, takes_time=True, args=("t", "v")),
    "cancel": Convention(prints_data=True, takes_time=False, args=("abc",)),
    "reschedule": Convention(prints_data=True, takes_time=True, args=("abc",)),
    "check": Convention(prints_data=True, takes_time=False),
    "pending": Convention(prints_data=True, takes_time=False),
    "find": Convention(prints_data=True, takes_time=False, args=("abc",)),
    "settings": Convention(prints_data=True, takes_time=False),
    "topics create": Convention(prints_data=True, takes_time=False),
    "topics describe": Convention(prints_data=True, takes_time=False),
    "audit": Convention(prints_data=True, takes_time=False),
}


def _commands(group: Any = None, prefix: str = "") -> dict[str, Any]:
    group = group or typer.main.get_command(app)
    found: dict[str, Any] = {}
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        if hasattr(command, "commands"):
            found.update(_commands(command, f"{path} "))
        else:
            found[path] = command
    return found


COMMANDS = _commands()


def _flags(path: str) -> set[str]:
    return {opt for param in COMMANDS[path].params for opt in param.opts if opt.startswith("-")}


def _one_line_exit_2(result: subprocess.CompletedProcess[str], *names: str) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    for name in names:
        assert name in line
    return line


def test_the_table_covers_every_command():
    assert set(TABLE) == set(COMMANDS)


@pytest.mark.parametrize("path", sorted(TABLE))
def test_a_command_that_prints_data_takes_json(path):
    assert ("--json" in _flags(path)) == TABLE[path].prints_data


@pytest.mark.parametrize("path", sorted(TABLE))
def test_an_absolute_time_is_at_with_deliver_at_as_the_same_flag(path):
    flags = _flags(path)
    if TABLE[path].takes_time:
        assert {"--delay", "-d", "--at", "--deliver-at"} <= flags
        (at,) = [p for p in COMMANDS[path].params if "--at" in p.opts]
        assert "--deliver-at" in at.opts  # one flag, two names
    else:
        assert not flags & {"--at", "--deliver-at", "--delay"}


@pytest.mark.parametrize("path", sorted(TABLE))
def test_an_unknown_flag_is_one_line_naming_it(path):
    words = path.split()
    _one_line_exit_2(_cli(*words, *TABLE[path].args, "--bogus"), "--bogus", f"delayservice {path}")


@pytest.mark.parametrize("path", [p for p in sorted(TABLE) if TABLE[p].takes_time])
def test_times_are_refused_in_one_line_naming_the_flags(path):
    words = [*path.split(), *TABLE[path].args]
    line = _one_line_exit_2(_cli(*words, "-d", "soon"), "--delay", "not a duration")
    assert "delay=" not in line
    both = _cli(*words, "-d", "3", "--deliver-at", "2030-01-01T00:00:00")
    line = _one_line_exit_2(both, "--delay", "--at")
    assert "deliver_at=" not in line
    _one_line_exit_2(_cli(*words, "-d", "-3"), "--delay", "negative")


@pytest.mark.parametrize(
    ("given", "seconds"), [("3", 3.0), ("1.5", 1.5), ("500ms", 0.5), ("2m", 120.0)]
)
def test_the_cli_reads_delays_as_the_sdk_does_bare_seconds_included(given, seconds):
    assert delivery_time(given, None) == (seconds, None)


@pytest.mark.parametrize(
    ("variable", "value", "shown"),
    [
        ("DELAYSERVICE_LOG_LEVEL", "info", 'log_level = "INFO"'),
        ("DELAYSERVICE_GUARANTEE", "Exactly-Once", 'guarantee = "exactly-once"'),
        ("DELAYSERVICE_LEVEL_WORKERS", "PER-LEVEL", 'level_workers = "per-level"'),
    ],
)
def test_enums_are_read_in_any_case(variable, value, shown):
    result = _cli("settings", env={variable: value})
    assert result.returncode == 0, result.stderr
    assert shown in result.stdout.splitlines()


def test_a_kept_cancel_is_applied_in_both_modes_whatever_its_word():
    """A level worker answers a kept cancel `cancelled`, a precise one `accepted`; the
    CLI's --json carries `applied`, which means the same in both."""
    from delayservice.cli.marker_command import reply_json

    level = MarkerReply("cancel", "m", "cancelled")
    precise = MarkerReply("cancel", "m", "accepted")
    assert reply_json(level)["applied"] is reply_json(precise)["applied"] is True
    assert reply_json(MarkerReply("cancel", "m", "too_late"))["applied"] is False


def test_json_output_is_json():
    import json

    result = _cli("settings", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["log_level"] == "INFO"
    probe = _cli("check", "--json", "--url", "http://127.0.0.1:1/readyz", "--timeout", "1")
    assert probe.returncode == 1
    assert json.loads(probe.stdout)["ready"] is False


def test_send_with_no_broker_fails_in_seconds_naming_it():
    """One message from a shell: an outage is said within about ten seconds (librdkafka
    would wait out its delivery timeout), naming the broker asked."""
    import time

    began = time.monotonic()
    result = _cli("send", "orders", "hi", "-d", "30s", "-b", "127.0.0.1:1")
    took = time.monotonic() - began
    assert result.returncode == 1, result.stderr
    assert "127.0.0.1:1" in result.stderr
    assert "not delivered" in result.stderr
    assert took < 25, f"took {took:.1f} s (the producer's 30 s delivery timeout, not 10 s)"
