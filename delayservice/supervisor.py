"""`processes = N`: N worker processes under one supervisor, so forwarding uses N cores.

The Python work per record runs on one consumer thread per level, under one GIL, so a
single process tops out at one core whatever the machine has. With `processes = N`
(N > 1) `delayservice run` becomes a supervisor that starts N ordinary daemons. Each
runs every level and joins every level's group as its own static member
(`{instance_name}-p{k}`), so Kafka spreads each level's partitions over the workers:
no coordination of ours is needed, and a worker restarted under its name takes its
partitions back at once. The memory budget is split evenly.

Operators still see one instance: the supervisor serves the only /metrics (the
workers' merged, see `merged_exposition`), one /healthz and one /readyz (ready when
every worker is). A worker that dies is restarted; one that exits for bad
configuration stops everything with its code, and more than `MAX_RESTARTS` restarts
within `RESTART_WINDOW_S` stop everything too, because something is wrong with the
host or the cluster rather than with one worker. Workers die with the supervisor
(parent-death signal), so a kill -9 of the supervisor leaves no orphans behind.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from typing import Final

from prometheus_client import CollectorRegistry

from delayservice.metrics.http_server import MetricsServer
from delayservice.metrics.merged_exposition import MergedCollector
from delayservice.ports import free_port
from delayservice.settings import Settings
from delayservice.settings_loading import settings_env

log = logging.getLogger(__name__)

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_CONFIG: Final = 2
MAX_RESTARTS: Final = 5
RESTART_WINDOW_S: Final = 300.0
SCRAPE_TIMEOUT_S: Final = 2.0
CHECK_INTERVAL_S: Final = 0.5
_PR_SET_PDEATHSIG: Final = 1


def worker_name(instance_name: str, index: int) -> str:
    return f"{instance_name}-p{index}"


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the supervisor dies, however it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class WorkerProcess:
    def __init__(self, settings: Settings, index: int, count: int) -> None:
        self.index = index
        self.name = worker_name(settings.instance_name, index)
        self._settings = settings
        self._count = count
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.port = free_port()
        env = settings_env(
            self._settings,
            processes=1,
            instance_name=self.name,
            metrics_host="127.0.0.1",
            metrics_port=self.port,
            max_buffered_bytes=max(1024 * 1024, self._settings.max_buffered_bytes // self._count),
        )
        self.process = subprocess.Popen(
            [sys.executable, "-m", "delayservice", "run"],
            env=env,
            preexec_fn=_die_with_parent,  # noqa: PLW1509  # prctl only; no locks taken
        )
        log.info("worker %s started (pid %d)", self.name, self.process.pid)

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def get(self, path: str) -> tuple[int, str]:
        """(status, body) of one of the worker's endpoints; (0, why) if it does not answer."""
        url = f"http://127.0.0.1:{self.port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as reply:
                return int(reply.status), reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except (urllib.error.URLError, OSError) as exc:
            return 0, f"not answering ({exc})"

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)


class Supervisor:
    def __init__(self, settings: Settings, registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self.registry = registry if registry is not None else CollectorRegistry()
        self.registry.register(MergedCollector(self._scrape))
        self.workers = [
            WorkerProcess(settings, k, settings.processes) for k in range(settings.processes)
        ]
        self._stop = threading.Event()
        self._restarts: deque[float] = deque()
        self._failure: int | None = None
        self._server: MetricsServer | None = None

    @property
    def metrics_port(self) -> int | None:
        return self._server.port if self._server else None

    def start(self) -> None:
        self._server = MetricsServer(
            self.registry, self.readiness, self.settings.metrics_host, self.settings.metrics_port
        )
        self._server.start()
        for worker in self.workers:
            worker.start()

    def readiness(self) -> tuple[bool, str]:
        answers = []
        ready = not self._stop.is_set()
        for worker in self.workers:
            if worker.exit_code() is not None:
                ready = False
                answers.append(f"{worker.name}: not running")
                continue
            status, body = worker.get("/readyz")
            ready = ready and status == 200
            answers.append(f"{worker.name}: {body.strip()}")
        return ready, ("ready: " if ready else "not ready: ") + " | ".join(answers)

    def _scrape(self) -> list[str]:
        texts = []
        for worker in self.workers:
            status, body = worker.get("/metrics")
            if status == 200:
                texts.append(body)
        return texts

    def request_stop(self) -> None:
        self._stop.set()

    def wait(self) -> int:
        """Watch the workers until a stop is requested or one cannot be kept running."""
        while not self._stop.wait(CHECK_INTERVAL_S):
            for worker in self.workers:
                code = worker.exit_code()
                if code is not None:
                    self._worker_exited(worker, code)
        return self.stop()

    def _worker_exited(self, worker: WorkerProcess, code: int) -> None:
        if code == EXIT_CONFIG:
            log.error("worker %s refused its configuration (exit %d); stopping", worker.name, code)
            self._fail(EXIT_CONFIG)
            return
        now = time.monotonic()
        while self._restarts and now - self._restarts[0] > RESTART_WINDOW_S:
            self._restarts.popleft()
        if len(self._restarts) >= MAX_RESTARTS:
            log.error(
                "worker %s exited with %d after %d restarts within %.0fs; stopping",
                worker.name,
                code,
                len(self._restarts),
                RESTART_WINDOW_S,
            )
            self._fail(EXIT_FAILED)
            return
        self._restarts.append(now)
        log.warning("worker %s exited with %d; restarting it", worker.name, code)
        worker.start()

    def _fail(self, code: int) -> None:
        if self._failure is None:
            self._failure = code
        self._stop.set()

    def stop(self) -> int:
        """SIGTERM every worker, wait `shutdown_timeout_s`, SIGKILL what is left."""
        self._stop.set()
        for worker in self.workers:
            worker.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.settings.shutdown_timeout_s
        clean = True
        for worker in self.workers:
            if worker.process is None:
                continue
            code = self._reap(worker.process, worker.name, deadline)
            clean = clean and code == EXIT_OK
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._failure is not None:
            return self._failure
        return EXIT_OK if clean else EXIT_FAILED

    @staticmethod
    def _reap(process: subprocess.Popen[bytes], name: str, deadline: float) -> int:
        try:
            return process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        log.error("worker %s did not stop in time; killing it", name)
        process.kill()
        return process.wait()
