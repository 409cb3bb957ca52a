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
import uuid
from collections.abc import Callable, Iterator

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _docker_engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _no_broker(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"no Kafka broker for the integration tests: {reason}", pytrace=False)
    pytest.skip(f"no Kafka broker: {reason}")


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
    from delayservice.kafka.local_broker import LocalBroker

    if shutil.which("java") is None or shutil.which("mvn") is None:
        _no_broker("neither DELAYSERVICE_TEST_BOOTSTRAP, a Docker engine, nor java+mvn")
    broker = LocalBroker()
    try:
        broker.start()
    except Exception as exc:  # noqa: BLE001
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
