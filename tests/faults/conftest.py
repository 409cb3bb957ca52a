"""Fixtures of the fault-injection suite, and the summary table printed at the end.

Each scenario gets a `FaultRun`: uuid-named topics on a broker, daemons as real
subprocesses, steady traffic, and a read-back that turns the broker's contents into
a `Report`. Every report becomes one row of the table (`summary_table`), printed in the
terminal summary and written to build/faults-summary.md, so a run leaves its numbers
behind even when a scenario fails.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from delayservice.producer import Precision
from delayservice.testing.local_broker import LocalBroker
from tests.faults.harness import Fleet, Reader, SentLog, Traffic, wait_until
from tests.faults.measure import Report, Source, Topology, evaluate
from tests.faults.summary_table import ROW_PROPERTY


@pytest.fixture
def fault_summary(request: pytest.FixtureRequest) -> Callable[[Report], None]:
    """Adds a scenario's row to the table; call it before asserting, so failures count."""
    return lambda report: request.node.user_properties.append((ROW_PROPERTY, report.row()))


class FaultRun:
    """One scenario's world on one broker; `close` stops every daemon it started."""

    def __init__(self, testbed: Any, log_dir: Path, bootstrap: str, **overrides: Any) -> None:
        self.testbed = testbed
        self.bootstrap = bootstrap
        self.settings = testbed.settings(bootstrap_servers=bootstrap, **overrides)
        testbed.create_delay_topics(self.settings)
        self.fleet = Fleet(self.settings, log_dir)
        self.sent = SentLog()
        self.target_partitions: dict[str, int] = {}
        self.reader: Reader | None = None
        self._traffic: list[Traffic] = []
        self.cancelled: set[str] = set()
        """Ids cancelled in time: judged apart (none may be delivered), not as lost."""

    def target(self, name: str, partitions: int = 3) -> str:
        """A target topic stamped with LogAppendTime, so arrival is the broker's clock."""
        topic = f"{name}-{self.testbed.tag}"
        self.testbed.create_topic(topic, partitions, {"message.timestamp.type": "LogAppendTime"})
        self.target_partitions[topic] = partitions
        return topic

    @property
    def topology(self) -> Topology:
        return Topology.of(self.settings, self.target_partitions)

    def traffic(
        self, targets: list[str], rate: float, seed: int, precision: Precision = "level"
    ) -> Traffic:
        traffic = Traffic(self.bootstrap, self.settings, targets, rate, seed, self.sent, precision)
        self._traffic.append(traffic.start())
        return traffic

    def wait_ready(self, *daemons: Any, timeout: float = 60.0) -> None:
        for daemon in daemons:
            if not wait_until(lambda d=daemon: d.ready() or not d.alive(), timeout):
                pytest.fail(f"daemon {daemon.instance} not ready in {timeout}s")
        self.assert_alive()

    def assert_alive(self) -> None:
        exits = self.fleet.unexpected_exits()
        assert not exits, "\n".join(exits)

    def read(self) -> Reader:
        if self.reader is None:
            self.reader = Reader(self.bootstrap, self.topology.reads())
        return self.reader

    def evaluate(
        self, scenario: str, may_dead_letter: Callable[[Source], bool] | None = None
    ) -> Report:
        report = evaluate(
            scenario, self.read(), self.topology, self.sent.snapshot(), may_dead_letter
        )
        report.logs = [str(d.log_path) for d in self.fleet.daemons]
        if self.cancelled:
            report.cancelled += [s for s in report.sources if s.expect.id in self.cancelled]
            report.sources = [s for s in report.sources if s.expect.id not in self.cancelled]
        return report

    def drain(
        self,
        scenario: str,
        timeout: float,
        may_dead_letter: Callable[[Source], bool] | None = None,
        stall_s: float = 45.0,  # past the daemon producer's 30 s message timeout
        while_live: Callable[[], None] | None = None,
    ) -> Report:
        """Read until every source is accounted for, no daemon is left to forward the
        rest, nothing new arrived for `stall_s`, or `timeout`. Then `while_live` runs
        (checks that need the daemons), every daemon is stopped (SIGTERM: what it
        forwards while it stops counts too), every partition is read to its end, and
        the scenario is judged: a copy written after the last source arrived is
        counted. Returns the report either way, so a failing scenario still has its
        numbers."""
        report = self._drained(scenario, timeout, may_dead_letter, stall_s)
        if while_live is not None:
            while_live()
        self.fleet.stop_all()
        exits = [d.sigterm_exit for d in self.fleet.daemons if d.sigterm_exit is not None]
        read_all = self._read_to_end()
        final = self.evaluate(scenario, may_dead_letter)
        final.notes += report.notes
        if any(exits):
            final.notes.append(f"SIGTERM exit codes at the end: {exits}")
        if not read_all:
            final.notes.append("the read-back did not reach every partition's end")
        if self.reader is not None and self.reader.rebuilt:
            final.notes.append(
                f"the test's reader replaced its client {self.reader.rebuilt} times "
                "(it could not give a partition's end)"
            )
        return final

    def _read_to_end(self, timeout: float = 120.0) -> bool:
        deadline = time.monotonic() + timeout
        reader = self.read()
        while time.monotonic() < deadline:
            if reader.catch_up(timeout=max(1.0, deadline - time.monotonic())):
                return True
        return False

    def _drained(
        self,
        scenario: str,
        timeout: float,
        may_dead_letter: Callable[[Source], bool] | None,
        stall_s: float,
    ) -> Report:
        unsent = sum(traffic.stop() for traffic in self._traffic)
        self._traffic.clear()
        reader = self.read()
        deadline = time.monotonic() + timeout
        progress, progress_at = -1, time.monotonic()
        while True:
            reader.catch_up()
            report = self.evaluate(scenario, may_dead_letter)
            now = time.monotonic()
            if report.accounted > progress:
                progress, progress_at = report.accounted, now
            stalled = now - progress_at > stall_s
            if report.lost and (stalled or now > deadline):
                for daemon in self.fleet.live():
                    daemon.dump_stacks()  # alive but not forwarding: say where it is stuck
                    report.notes.append(f"stacks of stuck {daemon.instance} in its log")
            if not report.lost or now > deadline or stalled or not self.fleet.live():
                if unsent or self.sent.failed:
                    report.notes.append(
                        f"{unsent + self.sent.failed} of the test's records never reached a level"
                    )
                return report
            time.sleep(0.5)

    def close(self) -> None:
        for traffic in self._traffic:
            traffic.stop(10)
        self.fleet.stop_all()
        if self.reader is not None:
            self.reader.close()


@pytest.fixture
def own_broker(unavailable: Callable[[str], Any]) -> Iterator[Any]:
    """A broker of the test's own, for faults that hit the broker (always the project's
    local broker). A broker session of 2 s (instead of 9) lets the restarted broker
    register at once, which keeps a restart to seconds; it also means a frozen broker
    fences itself on waking, a harsher version of what a real single-node broker does.
    Request it before `fault_run`: fixtures tear down in reverse, so the daemons stop
    before the broker."""
    if shutil.which("java") is None or shutil.which("mvn") is None:
        unavailable("java and mvn are needed for a broker of the test's own")
    broker = LocalBroker(
        heap="512m",
        extra_properties={
            "broker.session.timeout.ms": "2000",
            "broker.heartbeat.interval.ms": "500",
        },
    ).start()
    try:
        yield broker
    finally:
        broker.thaw()  # a frozen JVM ignores SIGTERM
        broker.stop()


@pytest.fixture
def fault_run(testbed: Any, tmp_path: Path) -> Iterator[Callable[..., FaultRun]]:
    """`fault_run(bootstrap, **settings)` builds a scenario; all are closed at teardown."""
    runs: list[FaultRun] = []

    def make(bootstrap: str, **overrides: Any) -> FaultRun:
        if bootstrap != testbed.bootstrap:
            testbed.use_broker(bootstrap)
        run = FaultRun(testbed, tmp_path, bootstrap, **overrides)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.close()
