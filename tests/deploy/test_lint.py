"""Lint the Dockerfile, the compose stack and the systemd unit with the tools this machine has.

There is no Docker engine here and no `docker compose` plugin to install (so no
`docker compose config` either): nothing is built or started. hadolint lints the
Dockerfile, dclint validates docker-compose.yml against the Compose Specification schema
and its best-practice rules, systemd-analyze verifies the unit, and
the checks below hold each file to what the daemon needs (known settings only, files
that exist, a stop grace longer than the daemon's own shutdown timeout).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from delayservice.settings import ENV_PREFIX, Settings

DEFAULT_SHUTDOWN_S = Settings.model_fields["shutdown_timeout_s"].default
DEFAULT_METRICS_PORT = Settings.model_fields["metrics_port"].default
# Read by the CLI, not a setting; every other DELAYSERVICE_* name must be a setting, or
# `delayservice run` stops with "unknown setting".
CLI_VARIABLES = {"DELAYSERVICE_CONFIG"}


def unknown_settings(names: list[str]) -> list[str]:
    known = {f"{ENV_PREFIX}{field}".upper() for field in Settings.model_fields} | CLI_VARIABLES
    return [n for n in names if n.upper().startswith(ENV_PREFIX) and n.upper() not in known]


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


# -- Dockerfile ------------------------------------------------------------------------
def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            word, _, rest = stripped.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_passes_hadolint(deploy):
    result = run(deploy.need_tool("hadolint"), "Dockerfile", cwd=deploy.root)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_is_multi_stage_non_root_and_runs_the_daemon_in_exec_form(deploy):
    instructions = dockerfile_instructions(deploy.root / "Dockerfile")
    stages = [i for i, (word, _) in enumerate(instructions) if word == "FROM"]
    assert len(stages) >= 2, "a build stage and a slim runtime stage"
    final = instructions[stages[-1] :]
    assert "slim" in instructions[0][1] or any("slim" in a for w, a in instructions if w == "ARG")
    users = [args for word, args in final if word == "USER"]
    assert users, "the runtime stage sets USER"
    assert users[-1].split(":")[0] not in {"root", "0"}, "the runtime runs as non-root"
    entrypoint = [json.loads(a) for w, a in final if w == "ENTRYPOINT"]
    cmd = [json.loads(a) for w, a in final if w == "CMD"]
    assert entrypoint, "ENTRYPOINT in exec (JSON) form"
    assert cmd, "CMD in exec (JSON) form"
    assert entrypoint[-1] + cmd[-1] == ["delayservice", "run"]
    (healthcheck,) = [a for w, a in final if w == "HEALTHCHECK"]
    probe = json.loads(healthcheck.split(" CMD ", 1)[1])
    assert probe[:2] == ["delayservice", "check"]
    # Configuration only through the settings at run time: none baked into the image.
    for word, args in instructions:
        assert not (word == "ENV" and ENV_PREFIX in args), f"baked setting: {args}"
        copied = args.replace("pyproject.toml", "")
        assert not (word in {"COPY", "ADD"} and ("config" in copied or ".toml" in copied)), args


def test_docker_build_context_holds_what_the_build_copies(deploy):
    lines = (deploy.root / ".dockerignore").read_text().splitlines()
    ignore = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    allowed = [p.removeprefix("!").rstrip("/") for p in ignore if p.startswith("!")]
    assert ignore[0] == "*", "allow-list the build context"
    for word, args in dockerfile_instructions(deploy.root / "Dockerfile"):
        if word == "COPY" and "--from" not in args:
            for source in args.split()[:-1]:
                assert source in allowed, f"COPY {source} is excluded by .dockerignore"
                assert (deploy.root / source).exists(), f"COPY {source}: no such file"


# -- docker-compose.yml ---------------------------------------------------------------
@pytest.fixture(scope="module")
def compose(deploy) -> dict[str, Any]:
    return deploy.load_yaml(deploy.root / "docker-compose.yml")


def test_compose_passes_dclint(deploy):
    config = Path(__file__).with_name("dclint.json")
    result = run(deploy.need_tool("dclint"), "-c", str(config), "--max-warnings", "0",
                 "docker-compose.yml", cwd=deploy.root)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_is_the_whole_stack_in_start_order(compose):
    services = compose["services"]
    assert set(services) == {"kafka", "topics", "delayservice", "prometheus", "grafana",
                             "example-producer", "example-consumer"}  # fmt: skip
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert "controller" in kafka["environment"]["KAFKA_PROCESS_ROLES"], "KRaft mode"
    assert services["topics"]["command"] == ["topics", "create"]
    assert services["topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    daemon = services["delayservice"]
    assert daemon["depends_on"]["topics"]["condition"] == "service_completed_successfully"
    assert "healthcheck" not in daemon, "the image's HEALTHCHECK (delayservice check) applies"
    grace = int(daemon["stop_grace_period"].removesuffix("s"))
    assert grace > DEFAULT_SHUTDOWN_S, "docker must wait for the daemon's graceful stop"
    assert services["example-producer"]["depends_on"]["delayservice"]["condition"] == (
        "service_healthy"
    )


def test_compose_passes_only_known_settings(compose):
    for name, service in compose["services"].items():
        environment = service.get("environment") or {}
        names = (
            list(environment)
            if isinstance(environment, dict)
            else [item.partition("=")[0] for item in environment]
        )
        assert unknown_settings(names) == [], f"{name}: would stop with 'unknown setting'"


def bind_mounts(service: dict[str, Any]) -> dict[str, str]:
    """Host path -> container path of a service's bind mounts, short or long syntax."""
    mounts = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            mounts[volume["source"]] = volume["target"]
        else:
            source, target = volume.split(":")[:2]
            mounts[source] = target
    return mounts


def test_compose_mounts_files_that_exist(deploy, compose):
    for name, service in compose["services"].items():
        for source in bind_mounts(service):
            if source.startswith("."):
                assert (deploy.root / source).exists(), f"{name} mounts missing {source}"
        entrypoint = service.get("entrypoint") or []
        for arg in entrypoint:
            if arg.startswith("/examples/"):
                script = deploy.root / "deploy" / "examples" / arg.removeprefix("/examples/")
                assert script.exists(), f"{name} runs missing {script}"


def test_compose_prometheus_scrapes_the_daemon_with_the_rules(deploy, compose):
    mounts = bind_mounts(compose["services"]["prometheus"])
    config = deploy.load_yaml(deploy.prometheus_dir / "prometheus.yml")
    assert mounts["./deploy/prometheus/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    assert mounts["./deploy/prometheus/alerts.yml"] == "/etc/prometheus/" + config["rule_files"][0]
    (job,) = config["scrape_configs"]
    (pattern,) = job["file_sd_configs"][0]["files"]
    targets_file = mounts["./deploy/prometheus/compose-targets.yml"]
    assert Path(targets_file).match("/etc/prometheus/" + pattern)
    (group,) = deploy.load_yaml(deploy.prometheus_dir / "compose-targets.yml")
    assert group["targets"] == [f"delayservice:{DEFAULT_METRICS_PORT}"]


def test_compose_grafana_provisions_the_datasource_and_dashboard(deploy, compose):
    mounts = bind_mounts(compose["services"]["grafana"])
    provider_file = deploy.root / "deploy/grafana/provisioning/dashboards/delayservice.yml"
    (provider,) = deploy.load_yaml(provider_file)["providers"]
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    datasources = deploy.load_yaml(
        deploy.root / "deploy/grafana/provisioning/datasources/prometheus.yml"
    )["datasources"]
    assert [d["type"] for d in datasources] == ["prometheus"]
    assert datasources[0]["url"] == "http://prometheus:9090"


# -- systemd ---------------------------------------------------------------------------
def unit_entries(path: Path) -> dict[str, list[str]]:
    entries: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";")):
            key, _, value = line.partition("=")
            entries.setdefault(key.strip(), []).append(value.strip())
    return entries


def test_systemd_unit_passes_systemd_analyze_verify(deploy, tmp_path):
    analyze = deploy.need_tool("systemd-analyze")
    binary = shutil.which("delayservice")
    assert binary is not None, "the package is installed, so its console script exists"
    unit = (deploy.root / "deploy/systemd/delayservice.service").read_text()
    # verify insists the ExecStart binary exists: point it at this machine's install.
    local = tmp_path / "delayservice.service"
    local.write_text(unit.replace("/opt/delayservice/bin/delayservice", binary))
    result = run(analyze, "verify", str(local), cwd=tmp_path)
    complaints = [line for line in (result.stdout + result.stderr).splitlines()
                  if "delayservice.service" in line]  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert not complaints, complaints


def test_systemd_unit_restarts_limits_memory_and_stops_gracefully(deploy):
    entries = unit_entries(deploy.root / "deploy/systemd/delayservice.service")
    assert entries["ExecStart"] == ["/opt/delayservice/bin/delayservice run"]
    assert entries["Restart"] == ["on-failure"]
    assert entries["RestartPreventExitStatus"] == ["2"], "bad configuration is not retried"
    assert entries["EnvironmentFile"] == ["/etc/delayservice/delayservice.env"]
    assert entries["MemoryMax"], "a memory limit"
    assert entries["KillSignal"] == ["SIGTERM"]
    stop_s = int(entries["TimeoutStopSec"][0].removesuffix("s"))
    assert stop_s > DEFAULT_SHUTDOWN_S, "systemd must wait for the daemon's graceful stop"
    assert entries["User"] != ["root"]


def test_systemd_environment_file_holds_only_settings(deploy):
    env = unit_entries(deploy.root / "deploy/systemd/delayservice.env")
    assert unknown_settings(list(env)) == []
    assert env["DELAYSERVICE_BOOTSTRAP_SERVERS"] == ["127.0.0.1:9092"], "the broker beside it"


# -- Grafana dashboard ----------------------------------------------------------------
def test_dashboard_is_importable_anywhere_and_repeats_per_level(deploy):
    board = deploy.dashboard()
    panels = deploy.dashboard_panels()
    assert len({p["id"] for p in panels}) == len(panels), "panel ids are unique"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource", "no hard-wired datasource uid"
    for panel in panels:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]
    assert [p["repeat"] for p in panels if p["type"] == "row" and "repeat" in p] == ["level"]
    titles = " ".join(p["title"].lower() for p in panels)
    for shown in ("consumed", "forwarded", "buffered messages", "buffered bytes", "paused",
                  "lateness percentiles", "lateness heatmap", "dead-lettered"):  # fmt: skip
        assert shown in titles
