"""Deploy files that agree with the daemon: each memory limit holds what the daemon may
take with the settings that file gives it (`delayservice.sizing`), every document quotes
the one measured figure per held record, and the images are pinned to real versions."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from delayservice import sizing
from delayservice.level.memory_budget import RECORD_OVERHEAD
from delayservice.settings import Settings
from delayservice.settings_loading import load_settings
from delayservice.testing.local_broker import KAFKA_VERSION
from tests.deploy.test_lint import bind_mounts, unit_entries
from tests.settings_environment import only_these_settings

UNITS = {"k": 1024, "m": 1024**2, "g": 1024**3}
SYSTEMD_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3}


def mib(size: int) -> str:
    return f"{round(size / sizing.MiB):,} MiB"


def daemon_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Services that run the daemon: the project's image with its own command (`run`)."""
    return {
        name: service
        for name, service in compose["services"].items()
        if service.get("image", "").startswith("delayservice")
        and "entrypoint" not in service
        and service.get("command", ["run"]) == ["run"]
    }


def compose_settings(root: Path, service: dict[str, Any]) -> Settings:
    """What the daemon in `service` loads: its environment, and the TOML file its
    DELAYSERVICE_CONFIG names, read from the host path mounted there."""
    env = {k: str(v) for k, v in (service.get("environment") or {}).items()}
    mounted = {target: source for source, target in bind_mounts(service).items()}
    config = env.pop("DELAYSERVICE_CONFIG", None)
    with only_these_settings(env):
        return load_settings(root / mounted[config] if config else None)


def test_each_daemon_container_has_room_for_what_it_may_hold(deploy):
    compose = deploy.load_yaml(deploy.root / "docker-compose.yml")
    services = daemon_services(compose)
    assert services, "the stack runs a daemon"
    for name, service in services.items():
        limit = service.get("mem_limit")
        assert limit, f"{name}: no mem_limit"
        limit_bytes = int(limit[:-1]) * UNITS[limit[-1].lower()]
        bound = sizing.process_bound(compose_settings(deploy.root, service))
        assert bound <= limit_bytes, f"{name}: may take {mib(bound)}, mem_limit is {limit}"
        assert f"{mib(bound)}" in (deploy.root / "docker-compose.yml").read_text()


def systemd_settings(root: Path) -> Settings:
    """What the unit's daemon loads: the environment file, and as its TOML the shipped
    config/delayservice.toml, which the install steps copy to where the file names."""
    env = {k: v[-1] for k, v in unit_entries(root / "deploy/systemd/delayservice.env").items()}
    assert env.pop("DELAYSERVICE_CONFIG") == "/etc/delayservice/delayservice.toml"
    with only_these_settings(env):
        return load_settings(root / "config" / "delayservice.toml")


def test_the_systemd_unit_has_room_for_what_the_daemon_may_hold(deploy):
    entries = unit_entries(deploy.root / "deploy/systemd/delayservice.service")
    bound = sizing.process_bound(systemd_settings(deploy.root))
    for key in ("MemoryHigh", "MemoryMax"):
        (value,) = entries[key]
        limit = int(value[:-1]) * SYSTEMD_UNITS[value[-1]]
        assert bound <= limit, f"{key}={value}, below the {mib(bound)} the daemon may take"
    unit_text = (deploy.root / "deploy/systemd/delayservice.service").read_text()
    operations = (deploy.root / "docs" / "operations.md").read_text()
    assert f"{bound // sizing.MiB:,} MiB" in unit_text.replace("\n# ", " ")
    assert f"{bound // sizing.MiB:,} MiB" in operations


def test_the_old_compose_limit_was_below_the_bound():
    """The stack as it was: five levels and precise mode on the shipped TOML (768 MiB of
    held records for each) in a 512 MiB container."""
    with only_these_settings(
        {"DELAYSERVICE_LEVELS": "5s,10s,30s,1m,5m", "DELAYSERVICE_PRECISE": "true"}
    ):
        settings = load_settings(Path(__file__).parents[2] / "config" / "delayservice.toml")
    assert sizing.process_bound(settings) > 512 * sizing.MiB


def test_the_cap_bounds_the_rss_of_what_is_held():
    """The measured RSS of a held record is within what the budget charges for it."""
    assert sizing.HELD_PAYLOAD_PER_RECORD + RECORD_OVERHEAD >= sizing.HELD_RSS_PER_RECORD


RSS_FIGURE = re.compile(r"\*{0,2}(\d[\d,]*) B\*{0,2} (?:of )?RSS\b")
SIZING_SOURCES = [
    "README.md",
    *(
        f"docs/{p.name}"
        for p in sorted((Path(__file__).parents[2] / "docs").glob("*.md"))
        if p.name != "performance.md"  # its earlier sittings keep their own figures
    ),
    "deploy/systemd/delayservice.service",
    "config/delayservice.toml",
    "docker-compose.yml",
]


def test_every_document_quotes_the_one_measured_figure(deploy):
    """The figure per held record comes from benchmarks/memory_per_message.py, in the
    sitting docs/performance.md records; every place that quotes RSS per record quotes
    that one (the README's 597 B, operations' 1,133 B and the unit's 72 MiB per level
    once disagreed)."""
    performance = (deploy.root / "docs" / "performance.md").read_text()
    row = next(line for line in performance.splitlines() if "bytes per held level record" in line)
    assert "memory_per_message.py" in row
    (sitting,) = RSS_FIGURE.findall(row)
    assert int(sitting.replace(",", "")) == sizing.HELD_RSS_PER_RECORD
    quoted = {
        source: {
            int(n.replace(",", "")) for n in RSS_FIGURE.findall((deploy.root / source).read_text())
        }
        for source in SIZING_SOURCES
    }
    assert {n for figures in quoted.values() for n in figures} == {sizing.HELD_RSS_PER_RECORD}
    for source in ("README.md", "docs/operations.md", "deploy/systemd/delayservice.service"):
        assert quoted[source], f"{source} does not quote the figure"


@pytest.mark.parametrize("service", ["kafka", "prometheus", "grafana"])
def test_compose_images_are_pinned_to_released_versions(deploy, service):
    """A full version, never `latest`; the broker's is the one the test suite runs. (That
    each exists was checked against the projects' own release records by hand: apache/kafka
    4.1.1 in Kafka's 4.1 docs, Prometheus v2.53.2's release, Grafana 11.2.0's changelog;
    no registry is reachable from the tests.)"""
    compose = deploy.load_yaml(deploy.root / "docker-compose.yml")
    image = compose["services"][service]["image"]
    name, _, tag = image.partition(":")
    assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{image} is not pinned to a release"
    if name == "apache/kafka":
        assert tag == KAFKA_VERSION, "the stack's broker is the version the tests run"
