"""`delayservice check` asks where `run` listens: the same settings (config file,
environment, metrics_host and metrics_port), so the image's HEALTHCHECK follows them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


class _Ready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ready = self.path == "/readyz"
        self.send_response(200 if ready else 404)
        self.end_headers()
        self.wfile.write(b"ready" if ready else b"no such page")

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def daemon_port() -> Iterator[int]:
    """A stand-in for the daemon's endpoint, on a port that is not the default."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DELAYSERVICE_")}
    return subprocess.run(
        [sys.executable, "-m", "delayservice", "check", *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_check_follows_the_metrics_port_and_host_from_the_environment(daemon_port):
    env = {"DELAYSERVICE_METRICS_PORT": str(daemon_port)}
    result = _check(env=env)
    assert (result.returncode, result.stdout.strip()) == (0, "ready"), result.stderr
    result = _check(env={**env, "DELAYSERVICE_METRICS_HOST": "127.0.0.1"})
    assert result.returncode == 0, result.stderr


def test_check_reads_the_config_file_run_reads(daemon_port, tmp_path: Path):
    config = tmp_path / "delayservice.toml"
    config.write_text(f'metrics_host = "0.0.0.0"\nmetrics_port = {daemon_port}\n')
    assert _check("--config", str(config)).returncode == 0
    assert _check(env={"DELAYSERVICE_CONFIG": str(config)}).returncode == 0
    # The settings' port, not the built-in one: nothing listens on the other.
    config.write_text(f"metrics_port = {daemon_port + 1 if daemon_port < 65535 else 1}\n")
    refused = _check("--config", str(config))
    assert refused.returncode == 1
    assert "not reachable" in refused.stderr


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--timeout", "-1"], "--timeout"),
        (["--timeout", "0"], "--timeout"),
        (["--timeout", "nan"], "--timeout"),
        (["--timeout", "soon"], "--timeout"),
        (["--config", "/nonexistent/delayservice.toml"], "--config"),
        (["--bogus"], "--bogus"),
    ],
)
def test_a_bad_flag_value_is_one_line_and_exit_2(args, names):
    result = _check(*args)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert names in line
    assert "Traceback" not in result.stderr


def test_a_port_picked_at_start_cannot_be_probed_without_a_url():
    result = _check(env={"DELAYSERVICE_METRICS_PORT": "0"})
    assert result.returncode == 2
    assert "pass --url" in result.stderr
