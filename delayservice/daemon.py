"""The daemon that runs beside each broker: one LevelWorker per level plus /metrics.

Start-up waits for the broker with backoff (reporting not-ready meanwhile), then
refuses to run over missing or misconfigured delay topics, because forwarding from a
CreateTime topic would tie due times to producer clocks. A stop commits what is safe,
flushes, and leaves the group within `shutdown_timeout_s`.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import threading
import time
from types import FrameType
from typing import Final, Protocol

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry

from delayservice.errors import DelayServiceError, TopicSetupError
from delayservice.kafka import client_config, topics
from delayservice.kafka.broker_clock import BrokerClock
from delayservice.level import layout, layout_guard
from delayservice.level.level_worker import LevelWorker
from delayservice.level.markers.level_markers import LevelMarkers
from delayservice.level.memory_budget import MemoryBudget
from delayservice.metrics.http_server import MetricsServer
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.precise.delivery.member_lease import MemberLease
from delayservice.precise.precise_worker import PreciseWorker
from delayservice.precise.storage.data_dir import check_data_dir, check_not_in_use
from delayservice.precise.wheel.held_bytes import HeldBytes
from delayservice.settings import Settings

log = logging.getLogger(__name__)


class Worker(Protocol):
    """What the daemon runs: the level workers (`level.layout`), plus the precise
    wheel's when it is on."""

    @property
    def name(self) -> str: ...

    def start(self) -> None: ...

    def request_stop(self) -> None: ...

    def join(self, timeout: float) -> bool: ...

    def health(self) -> tuple[bool, str]: ...


SIGNAL_CHECK_S: Final = 0.5
"""How often the main thread wakes to run a signal handler that is due (`Daemon.wait`)."""
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2


class Daemon:
    def __init__(self, settings: Settings, registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = ServiceMetrics(self.registry)
        self.workers: list[Worker] = []
        self.markers: Worker | None = None
        """Level mode's cancels and reschedules (`level.markers`), beside the workers."""
        self.layout_watch: Worker | None = None
        """Looks for the other worker layout's members while this one runs."""
        self.lease: MemberLease | None = None
        """Precise mode: this process is the only one of its `precise_member`."""
        self.budget = MemoryBudget(settings.max_buffered_bytes)
        self.metrics.memory_limit.set(settings.max_buffered_bytes)
        self.metrics.memory_used.set_function(lambda: float(self.budget.used))
        self.broker_clock = BrokerClock()
        self.metrics.clock_hold_back.set_function(lambda: self.broker_clock.hold_back_s)
        self._stop = threading.Event()
        self._fatal: str | None = None
        self._phase = "starting"
        self._server: MetricsServer | None = None
        self.metrics.ready.set_function(lambda: 1.0 if self.readiness()[0] else 0.0)

    # -- readiness -----------------------------------------------------------------
    def readiness(self) -> tuple[bool, str]:
        if self._phase != "running":
            return False, self._phase
        states = [worker.health() for worker in self._all()]
        ready = all(ok for ok, _ in states)
        reasons = "; ".join(why for _, why in states if why)
        return ready, ("ready: " if ready else "not ready: ") + reasons

    @property
    def metrics_port(self) -> int | None:
        return self._server.port if self._server else None

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        """Serve metrics, wait for the broker, check topics, start workers.

        Raises ConfigError / TopicSetupError for problems an operator must fix.
        """
        self._server = MetricsServer(
            self.registry, self.readiness, self.settings.metrics_host, self.settings.metrics_port
        )
        self._server.start()
        if self.settings.precise:
            check_data_dir(self.settings.data_dir)  # before the broker: a setting to fix
            check_not_in_use(
                self.settings.data_dir,
                (self.settings.precise_topic, self.settings.precise_far_topic),
            )
        admin = AdminClient(client_config.admin(self.settings))
        statuses = self._wait_for_broker(admin)
        if statuses is None:
            return  # asked to stop while waiting
        problems = topics.problems_summary(statuses)
        if problems:
            raise TopicSetupError(
                f"{problems[0]}"
                + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
                + "; run `delayservice topics create` / `topics describe`"
            )
        for line in topics.advice(statuses, self.settings):
            log.warning("topics: %s", line)
        self._phase = "waiting for the other worker layout's members to leave"
        layout_guard.wait_until_alone(admin, self.settings, self._stop)
        if self.settings.precise:
            self._phase = "waiting for the last process of this precise_member to leave"
            self.lease = MemberLease(
                self.settings, self.fail, lambda: AdminClient(client_config.admin(self.settings))
            )
            self.lease.claim(self._stop)
        if self._stop.is_set():
            return
        # Built in full before any starts: a worker that cannot be built (a data directory
        # in use) must not leave unstarted ones behind for `stop` to join. Each level
        # worker forwards through a producer of its own (its commit point flushes, or
        # commits the transaction of, what that worker sent); precise mode forwards
        # through one of its own too, and reports progress (replicas) through the one
        # made here.
        markers = LevelMarkers(
            self.settings,
            self.metrics,
            lambda: int(self.broker_clock.time() * 1000),
            budget=self.budget,
        )
        workers: list[Worker] = [
            LevelWorker(
                plan,
                self.settings,
                self.metrics,
                self.budget,
                self.fail,
                broker_clock=self.broker_clock,
                markers=markers,
            )
            for plan in layout.workers(self.settings)
        ]
        if self.settings.precise:
            client_id = f"delayservice-{socket.gethostname()}-{os.getpid()}"
            producer = Producer(client_config.producer(self.settings, client_id))
            held = HeldBytes(self.settings.max_buffered_bytes)  # one cap for both wheels
            workers.extend(
                PreciseWorker(self.settings, self.metrics, producer, self.fail, far=far, held=held)
                for far in (False, True)
            )
        self.workers = workers
        self.markers = markers
        watch = layout_guard.LayoutWatch(
            self.settings, lambda: AdminClient(client_config.admin(self.settings))
        )
        self.layout_watch = watch
        if self.lease is not None:
            self.lease.start()  # joins its group before the precise workers forward
        markers.start()  # first: the level forwarders wait for the markers it reads
        for worker in self.workers:
            worker.start()
        watch.start()
        self._phase = "running"
        log.info(
            "forwarding %d levels (%s, level workers %s) from %s",
            len(self.settings.level_set()),
            self.settings.level_set().spec(),
            self.settings.level_workers,
            self.settings.bootstrap_servers,
        )

    def _wait_for_broker(self, admin: AdminClient) -> list[topics.TopicStatus] | None:
        delay = 1.0
        self._phase = "waiting for the broker"
        while not self._stop.is_set():
            try:
                return topics.describe(admin, self.settings, timeout=10.0)
            except DelayServiceError as exc:
                log.warning(
                    "broker %s unreachable (%s); retrying in %.0fs",
                    self.settings.bootstrap_servers,
                    exc,
                    delay,
                )
            self._stop.wait(delay)
            delay = min(delay * 2, 30.0)
        return None

    def _all(self) -> list[Worker]:
        extra = [w for w in (self.markers, self.layout_watch, self.lease) if w is not None]
        return [*self.workers, *extra]

    def fail(self, why: str) -> None:
        """A worker hit something it cannot recover from; stop everything, exit non-zero."""
        if self._fatal is None:
            self._fatal = why
            log.error("stopping: %s", why)
        self._stop.set()

    def request_stop(self) -> None:
        self._stop.set()

    def wait(self) -> int:
        """Block until a stop is requested, then stop; returns the exit code.

        Waits in slices: Python runs a signal handler on the main thread only, and a
        process-directed SIGTERM the kernel delivers to another thread (any of ours
        may take it) does not wake a main thread blocked on a lock with no timeout.
        Waiting for ever, a daemon could ignore SIGTERM until SIGKILL."""
        while not self._stop.wait(SIGNAL_CHECK_S):
            pass
        return self.stop()

    def stop(self) -> int:
        self._stop.set()
        self._phase = "stopping"
        deadline = time.monotonic() + self.settings.shutdown_timeout_s
        for worker in self._all():
            worker.request_stop()
        stuck = [w.name for w in self._all() if not w.join(max(0.1, deadline - time.monotonic()))]
        if stuck:
            log.error("workers did not stop in time: %s", ", ".join(stuck))
        if self._server is not None:
            self._server.stop()
            self._server = None
        self._phase = "stopped"
        return EXIT_FAILED if (self._fatal or stuck) else EXIT_OK


GC_THRESHOLDS: Final = (100_000, 1_000, 1_000)


def tune_garbage_collector() -> None:
    """Collect young objects every 100,000 allocations instead of every 700, and the
    older generations a thousand times more rarely than CPython's default.

    Each forwarded record allocates a handful of containers (held record, header
    tuples, the delivery callback), and with the default thresholds the cyclic
    collector ran thousands of times per second over them: it cost about 40% of the
    per-record work on the consumer thread (3.9 against 7.2 us to hold one record).
    The older generations hold every buffered record, so each of their collections
    stalls forwarding: at a steady 10,000 msg/s, p99 lateness was 210 ms with the
    default thresholds and 22 to 46 ms with these (five runs on a shared host). The hot
    path makes no reference cycles (records are freed by reference counting), so
    collecting rarely keeps memory flat. What start-up built is frozen out of every
    later collection. Process-wide, so the process's entry point calls it, not the
    daemon (tests and benchmarks run daemons inside processes of their own).
    """
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class Stoppable(Protocol):
    def request_stop(self) -> None: ...


def install_signal_handlers(daemon: Stoppable) -> None:
    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        daemon.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
