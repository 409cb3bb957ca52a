"""`delayservice run` as the benchmarks start it: in a process of its own, as deployed,
so every figure is taken from outside the daemon."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from delayservice.ports import free_port
from delayservice.settings import Settings
from delayservice.settings_loading import settings_env


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def running_daemon(
    settings: Settings,
    instance: str,
    *,
    quiet: bool = False,
    ready_within: float | None = None,
    on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
    ready_poll_s: float = 0.2,
    port: int | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """A daemon for `settings`, stopped by SIGTERM on exit; with `ready_within`, entered
    only once /readyz answers 200 (or fails after that many seconds). `on_start` sees
    the process as soon as it is spawned: what happens before ready (an intake catching
    up) can be watched from there. Its /metrics answers on `port` (a free one if None)."""
    port = port or free_port()
    output = subprocess.DEVNULL if quiet else None
    process = subprocess.Popen(
        [sys.executable, "-m", "delayservice", "run"],
        env=settings_env(
            settings,
            instance_name=instance,
            metrics_host="127.0.0.1",
            metrics_port=port,
            log_level="WARNING",
        ),
        stdout=output,
        stderr=output,
    )
    try:
        if on_start is not None:
            on_start(process)
        if ready_within is not None:
            deadline = time.monotonic() + ready_within
            while not ready(port):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the daemon did not become ready within {ready_within:.0f} s")
                time.sleep(ready_poll_s)
        yield process
    finally:
        process.terminate()
        process.wait(60)


def metrics_port(pid: int) -> int:
    """The daemon's metrics port, from its environment."""
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        name, _, value = item.partition(b"=")
        if name == b"DELAYSERVICE_METRICS_PORT":
            return int(value)
    raise RuntimeError(f"process {pid} has no DELAYSERVICE_METRICS_PORT")


def scrape(port: int) -> dict[str, float]:
    """Samples of /metrics, by their full series name (`name{labels}`)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[series] = float(value)
    return out


def series_sum(metrics: dict[str, float], name: str, **labels: str) -> float:
    """The sum of every series of `name` that has these labels (-1 when there is none):
    precise mode's gauges have one series per wheel (`level` exact and exact-far)."""
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    found = [
        value
        for series, value in metrics.items()
        if series.partition("{")[0] == name and all(w in series for w in wanted)
    ]
    return sum(found) if found else -1.0
