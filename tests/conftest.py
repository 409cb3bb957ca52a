"""Shared fixtures: one real Kafka broker for the whole session.

Three paths sit behind the one `kafka_bootstrap` fixture, tried in order:
`DELAYSERVICE_TEST_BOOTSTRAP` (an existing broker), testcontainers when a Docker engine
answers, and the project's own broker built from Maven Central artifacts. When none
works, the tests that need Kafka fail under CI=true and skip elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import pytest

from tests.ci import IN_CI


def _docker_engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return (
            subprocess.run(
                ["docker", "info"], capture_output=True, timeout=10, check=False
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def _unavailable(reason: str) -> NoReturn:
    """Something a test needs is missing here: under CI=true that fails the test (a
    missing install step must not hide behind a green run); elsewhere it skips."""
    outcome = pytest.fail if IN_CI else pytest.skip
    outcome(reason)
    raise AssertionError("unreachable")


_FAULT_ROWS: list[dict[str, str]] = []
"""Rows of the fault-injection summary, gathered from every test's report: here, in the
root conftest, because under pytest-xdist only the controller prints, and it loads no
conftest below this one."""


def pytest_configure(config: pytest.Config) -> None:
    """No property test has a deadline: Hypothesis's default (200 ms an example) is a
    timed assertion, and on a loaded two-core host it failed a slot-file property
    that passed on every rerun. Tests with settings of their own keep them."""
    from hypothesis import settings

    settings.register_profile("delayservice", deadline=None)
    settings.load_profile("delayservice")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":  # a row added during the call is on this report too
        from tests.faults.summary_table import rows_of

        _FAULT_ROWS.extend(rows_of(report.user_properties))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if _FAULT_ROWS and not hasattr(config, "workerinput"):
        from tests.faults.summary_table import write

        write(terminalreporter, config.rootpath, _FAULT_ROWS)


@pytest.fixture(scope="session")
def unavailable() -> Callable[[str], NoReturn]:
    """`_unavailable`, for conftests and tests below this folder."""
    return _unavailable


def _no_broker(reason: str) -> NoReturn:
    _unavailable(f"no Kafka broker for the integration tests: {reason}")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    existing = os.environ.get("DELAYSERVICE_TEST_BOOTSTRAP")
    if existing:
        yield existing
        return
    if _docker_engine_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    from delayservice.testing.local_broker import LocalBroker

    if shutil.which("java") is None or shutil.which("mvn") is None:
        _no_broker("neither DELAYSERVICE_TEST_BOOTSTRAP, a Docker engine, nor java+mvn")
    broker = LocalBroker()
    try:
        broker.start()
    except Exception as exc:
        broker.stop()
        _no_broker(f"the local broker did not start: {exc}")
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    """uuid-suffixed names, so tests sharing one broker never see each other's data."""

    def make(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:10]}"

    return make


class Testbed:
    """Everything an integration test needs on the shared broker, under unique names.

    Each testbed has its own topic prefix, dead-letter topic and consumer group, so
    tests never see each other's records; daemons it starts are stopped at teardown.
    """

    def __init__(self, bootstrap: str, tag: str) -> None:
        from confluent_kafka.admin import AdminClient

        self.bootstrap = bootstrap
        self.tag = tag
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self._daemons: list[Any] = []
        self.level_workers: str | None = None
        """The worker layout of every daemon this testbed's settings make (None: the
        settings' default)."""

    def use_broker(self, bootstrap: str) -> None:
        """Point this testbed at another broker (tests that need one of their own)."""
        from confluent_kafka.admin import AdminClient

        self.bootstrap = bootstrap
        self.admin = AdminClient({"bootstrap.servers": bootstrap})

    def settings(self, **overrides: Any) -> Any:
        from delayservice.settings_loading import load_settings

        values: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "levels": "1s,2s,3s",
            "topic_prefix": f"dt-{self.tag}-",
            "dead_letter_topic": f"dlq-{self.tag}",
            "markers_topic": f"dm-{self.tag}",
            "group_id": f"ds-{self.tag}",
            "metrics_port": 0,
            "metrics_host": "127.0.0.1",
            "commit_interval_s": 0.2,
            "retry_backoff_s": 0.2,
            "shutdown_timeout_s": 15,
        }
        if self.level_workers is not None:
            values["level_workers"] = self.level_workers
        values.update(overrides)
        return load_settings(**values)

    def create_delay_topics(self, settings: Any) -> None:
        from delayservice.kafka import topics

        topics.create(self.admin, settings)

    def create_topic(
        self, name: str, partitions: int = 3, config: dict[str, str] | None = None
    ) -> str:
        from confluent_kafka.admin import NewTopic

        futures = self.admin.create_topics([NewTopic(name, partitions, 1, config=config or {})])
        futures[name].result(30)
        return name

    def start_daemon(self, settings: Any, instance: str | None = None) -> Any:
        """Each daemon gets its own static-membership name unless `instance` is given
        (a restart under the same name takes its partitions back at once)."""
        from delayservice.daemon import Daemon

        name = instance or f"{self.tag}-{len(self._daemons)}"
        daemon = Daemon(settings.model_copy(update={"instance_name": name}))
        self._daemons.append(daemon)
        daemon.start()
        return daemon

    def wait_assigned(self, *daemons: Any, partitions: int, timeout: float = 60.0) -> None:
        """Until the daemons together own every partition of every level."""

        def owned() -> bool:
            counts: dict[str, int] = {}
            for daemon in daemons:
                for worker in daemon.workers:
                    if hasattr(worker, "loop"):  # a level worker: each of its levels
                        for level in worker.levels:
                            owned = len(worker.loop.owned(level.topic))
                            counts[level.topic] = counts.get(level.topic, 0) + owned
                    else:  # a precise worker
                        topic = worker.level.topic
                        counts[topic] = counts.get(topic, 0) + len(worker.ledger.partitions)
            return all(count == partitions for count in counts.values())

        wait_for(owned, timeout, "the daemons to be assigned every partition")

    def producer(self, settings: Any) -> Any:
        from delayservice.producer import DelayProducer

        return DelayProducer(
            {"bootstrap.servers": self.bootstrap, "linger.ms": 5}, settings=settings
        )

    def collect(self, topic: str, count: int, timeout: float = 60.0) -> list[Any]:
        """Read `count` records from the start of `topic`, then on to the end the topic
        has by then, so a copy written twice is among them (fails on timeout with what
        it got). Read committed, as an exactly-once application would."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"collect-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        records: list[Any] = []
        deadline = time.monotonic() + timeout
        try:
            # A topic just made can be listed without its partitions for a moment: read
            # none of them, and this waited out its timeout on a record already there.
            partitions: dict[int, Any] = {}
            while not partitions and time.monotonic() < deadline:
                listed = consumer.list_topics(topic, timeout=15).topics.get(topic)
                partitions = listed.partitions if listed is not None else {}
                if not partitions:
                    time.sleep(0.1)
            tps = [TopicPartition(topic, p, 0) for p in partitions]
            consumer.assign(tps)
            ends: dict[int, int] | None = None
            while time.monotonic() < deadline:
                if ends is None and len(records) >= count:
                    marks = {tp.partition: consumer.get_watermark_offsets(tp, 10) for tp in tps}
                    ends = {p: high for p, (low, high) in marks.items() if high > low}
                # The position, not the last offset read: it steps over commit markers.
                if ends is not None and all(
                    tp.offset >= ends[tp.partition]
                    for tp in consumer.position(tps)
                    if tp.partition in ends
                ):
                    break
                records.extend(m for m in consumer.consume(1000, 0.2) if m.error() is None)
            if len(records) < count:
                from tests.daemon_snapshot import snapshot, where_read

                pytest.fail(
                    f"{topic}: got {len(records)} of {count} records in {timeout}s\n"
                    + where_read(consumer, tps)
                    + snapshot(self._daemons)
                )
        finally:
            consumer.close()
        return records

    @staticmethod
    def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
        wait_for(condition, timeout, what)

    def close(self) -> None:
        for daemon in self._daemons:
            daemon.stop()


def wait_for(
    condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def testbed(kafka_bootstrap: str) -> Iterator[Testbed]:
    bed = Testbed(kafka_bootstrap, uuid.uuid4().hex[:8])
    try:
        yield bed
    finally:
        bed.close()


@pytest.fixture(scope="session")
def java_partitions() -> Callable[[list[str], int], dict[str, int]]:
    """The partitions Apache Kafka's own Java client picks, computed by that client."""
    from pathlib import Path

    from delayservice.testing.local_broker import ensure_jars

    if shutil.which("java") is None:
        _no_broker("java is needed to compute Java client partitions")
    libs = ensure_jars()
    source = Path(__file__).with_name("JavaPartitioner.java")

    def compute(keys: list[str], partitions: int) -> dict[str, int]:
        result = subprocess.run(
            ["java", "-cp", f"{libs}/*", str(source), str(partitions), *keys],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        return dict(zip(keys, map(int, result.stdout.split()), strict=True))

    return compute
