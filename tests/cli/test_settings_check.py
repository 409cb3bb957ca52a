"""`delayservice settings` fails where the daemon would, before a restart: a librdkafka
key or value the client library refuses when the daemon builds its clients, and a
memory bound above the limit the daemon will run under (issue 49)."""

from __future__ import annotations

from pathlib import Path

import pytest

from delayservice import sizing
from delayservice.settings_loading import load_settings
from tests.cli.test_commands import _cli
from tests.deploy.test_lint import unit_entries
from tests.deploy.test_sizing import systemd_settings
from tests.settings_environment import only_these_settings


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"DELAYSERVICE_KAFKA": '{"bogus.key": "1"}'}, "kafka.bogus.key"),
        ({"DELAYSERVICE_CONSUMER": '{"fetch.max.bytes": "lots"}'}, "consumer.fetch.max.bytes"),
        ({"DELAYSERVICE_PRODUCER": '{"batch.num.messages": "0"}'}, "producer.batch.num.messages"),
        (  # librdkafka refuses the combination under exactly-once
            {
                "DELAYSERVICE_GUARANTEE": "exactly-once",
                "DELAYSERVICE_PRODUCER": '{"delivery.timeout.ms": "60000"}',
            },
            "producer",
        ),
    ],
)
def test_a_key_or_value_librdkafka_refuses_is_one_line_and_exit_2(
    env: dict[str, str], named: str
) -> None:
    result = _cli("settings", env=env)
    assert result.returncode == 2, (result.stdout, result.stderr)
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"delayservice: invalid setting {named}"), line
    assert result.stdout == ""


def test_the_memory_the_daemon_may_take_is_said_and_held_to_the_limit() -> None:
    fits = _cli("settings", "--memory-max", "2G")
    assert fits.returncode == 0, fits.stderr
    (said,) = fits.stderr.strip().splitlines()
    assert said.startswith("memory: the daemon may take 1,720 MiB ("), said
    assert said.endswith("limit 2,048 MiB (--memory-max)"), said
    tight = _cli("settings", "--memory-max", "1G")
    assert tight.returncode == 2
    assert tight.stderr.strip().splitlines()[-1] == (
        "delayservice: the daemon may take 1,720 MiB with these settings, above the "
        "1,024 MiB limit (--memory-max): raise the limit, or lower max_buffered_bytes "
        "or the levels"
    )
    bad = _cli("settings", "--memory-max", "lots")
    assert (bad.returncode, bad.stderr.strip()) == (
        2,
        "delayservice: --memory-max: 'lots' is not a size like 512M or 2G",
    )


def test_precise_mode_on_the_shipped_systemd_settings_needs_the_larger_limit_the_unit_names() -> (
    None
):
    """The unit's MemoryMax holds the level-only daemon; with precise mode on it does not,
    and both the unit's comment and `settings --memory-max` say so."""
    root = Path(__file__).parents[2]
    unit = root / "deploy/systemd/delayservice.service"
    (memory_max,) = unit_entries(unit)["MemoryMax"]
    env = {"DELAYSERVICE_PRECISE": "true", "DELAYSERVICE_DATA_DIR": "/tmp/unused"}
    with only_these_settings(env):
        precise = load_settings(root / "config" / "delayservice.toml")
    bound = sizing.process_bound(precise)
    assert bound > sizing.parse_size(memory_max), "precise mode now fits: update the unit"
    assert f"{bound // sizing.MiB:,} MiB" in unit.read_text().replace("\n# ", " ")
    assert sizing.process_bound(systemd_settings(root)) <= sizing.parse_size(memory_max)
    result = _cli(
        "settings", "--config", str(root / "config" / "delayservice.toml"),
        "--memory-max", memory_max, env=env,
    )  # fmt: skip
    assert result.returncode == 2
    assert f"may take {bound // sizing.MiB:,} MiB" in result.stderr
