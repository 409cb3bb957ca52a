"""docs/security.md's ACLs, on a broker that authenticates (SASL/PLAIN) and authorizes.

The ACLs are parsed from the doc's `kafka-acls.sh` commands and applied as they stand,
so the doc cannot say one thing while the test grants another. With exactly those: an
application sends and cancels, and is refused on the topics only daemons write; a
daemon (levels and precise mode, exactly-once) delivers on time.
"""

from __future__ import annotations

import itertools
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from delayservice.kafka import topics
from delayservice.ports import free_port
from delayservice.producer import DelayProducer
from delayservice.settings import Settings
from delayservice.settings_loading import load_settings, settings_env
from tests.conftest import wait_for
from tests.kafka.secured_broker import SecuredBroker

pytestmark = pytest.mark.kafka

DOC = Path(__file__).resolve().parents[1] / "docs" / "security.md"
TARGET_PREFIX = "orders"
"""The doc's example target topics: every topic whose name starts with this."""
_RESOURCES = {
    "--topic": ResourceType.TOPIC,
    "--group": ResourceType.GROUP,
    "--transactional-id": ResourceType.TRANSACTIONAL_ID,
}
_OPERATIONS = {
    "Read": AclOperation.READ,
    "Write": AclOperation.WRITE,
    "Describe": AclOperation.DESCRIBE,
    "DescribeConfigs": AclOperation.DESCRIBE_CONFIGS,
    "IdempotentWrite": AclOperation.IDEMPOTENT_WRITE,
}


def documented_acls(text: str) -> list[AclBinding]:
    """Every ACL the doc's `kafka-acls.sh --add` commands grant."""
    bindings = []
    for line in text.splitlines():
        if not line.startswith("kafka-acls.sh "):
            continue
        words = shlex.split(line)
        assert "--add" in words, line
        principal, pattern, resource = None, ResourcePatternType.LITERAL, None
        operations = []
        for flag, value in itertools.pairwise(words):
            if flag == "--allow-principal":
                principal = value
            elif flag == "--operation":
                operations.append(_OPERATIONS[value])
            elif flag == "--resource-pattern-type":
                pattern = ResourcePatternType[value.upper()]
            elif flag in _RESOURCES:
                resource = (_RESOURCES[flag], value)
        assert principal is not None, line
        assert resource is not None, line
        assert operations, line
        bindings.extend(
            AclBinding(
                resource[0],
                resource[1],
                pattern,
                principal,
                "*",
                operation,
                AclPermissionType.ALLOW,
            )
            for operation in operations
        )
    return bindings


def _matches(acl: AclBinding, name: str) -> bool:
    if acl.resource_pattern_type == ResourcePatternType.PREFIXED:
        return name.startswith(acl.name)
    return name == acl.name


def test_the_doc_lists_acls_for_both_principals():
    acls = documented_acls(DOC.read_text())
    assert {acl.principal for acl in acls} == {"User:app", "User:daemon"}
    written = [
        acl
        for acl in acls
        if acl.principal == "User:app"
        and acl.operation == AclOperation.WRITE
        and acl.restype == ResourceType.TOPIC
    ]
    settings = load_settings(precise=True)
    for daemons_only in (
        settings.markers_outcomes_topic,
        settings.precise_outcomes_topic,
        settings.precise_done_topic,
        settings.precise_far_done_topic,
        settings.dead_letter_topic,
    ):
        assert not any(_matches(acl, daemons_only) for acl in written), daemons_only


@pytest.fixture(scope="module")
def broker(unavailable: Any) -> Iterator[SecuredBroker]:
    if shutil.which("java") is None or shutil.which("mvn") is None:
        unavailable("the secured broker needs java and mvn")
    secured = SecuredBroker()
    try:
        secured.start()
    except Exception as exc:
        secured.stop()
        unavailable(f"the secured broker did not start: {exc}")
    try:
        yield secured
    finally:
        secured.stop()


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _refusals(login: dict[str, str], topic: str) -> list[int]:
    """The error codes of one record `login` writes to `topic`."""
    codes: list[int] = []
    producer = Producer({**login, "message.timeout.ms": 10_000})
    producer.produce(
        topic, b"forged", b"sent:0", on_delivery=lambda err, _msg: codes.append(err and err.code())
    )
    producer.flush(20)
    return codes


def _read(login: dict[str, str], topic: str, want: set[bytes], timeout: float) -> list[Any]:
    """Records of `topic` (read_committed) until every value in `want` is among them."""
    consumer = Consumer(
        {
            **login,
            "group.id": f"security-test-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        records: list[Any] = []
        deadline = time.monotonic() + timeout
        while not want <= {m.value() for m in records}:
            assert time.monotonic() < deadline, f"{topic}: only {[m.value() for m in records]}"
            records.extend(m for m in consumer.consume(100, 0.5) if m.error() is None)
        return records
    finally:
        consumer.close()


def test_an_application_and_a_daemon_work_with_exactly_the_documented_acls(broker, tmp_path):
    tag = uuid.uuid4().hex[:8]
    daemon_login = broker.login("daemon")
    settings: Settings = load_settings(
        bootstrap_servers=broker.sasl_bootstrap,
        levels="2s,4s",
        precise=True,
        guarantee="exactly-once",
        partitions=1,
        data_dir=tmp_path / "data",
        instance_name=f"secured-{tag}",
        kafka={k: v for k, v in daemon_login.items() if k != "bootstrap.servers"},
    )
    admin = AdminClient(broker.login("admin"))
    topics.create(admin, settings)
    target = f"{TARGET_PREFIX}-{tag}"
    admin.create_topics([NewTopic(target, 1, 1)])[target].result(30)
    for future in admin.create_acls(documented_acls(DOC.read_text())).values():
        future.result(30)

    app_login = broker.login("app")
    # The authorizer follows the metadata log: wait until the app may see its topics.
    probe = AdminClient(app_login)
    first_level = settings.level_set().levels[0].topic
    wait_for(lambda: first_level in probe.list_topics(timeout=5).topics, 30, "the ACLs to apply")

    # Only daemons write the outcomes and done topics.
    for daemons_only in (
        settings.markers_outcomes_topic,
        settings.precise_outcomes_topic,
        settings.precise_done_topic,
        settings.precise_far_done_topic,
    ):
        assert _refusals(app_login, daemons_only) == [KafkaError.TOPIC_AUTHORIZATION_FAILED], (
            daemons_only
        )

    port = free_port()
    env = settings_env(
        settings,
        metrics_host="127.0.0.1",
        metrics_port=port,
        commit_interval_s=0.2,
        session_timeout_s=6,
        shutdown_timeout_s=15,
    )
    log_file = tmp_path / "daemon.log"
    with log_file.open("wb") as out:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "delayservice", "run"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: _ready(port) or daemon.poll() is not None, 90, "the daemon to be ready")
        assert daemon.poll() is None, log_file.read_text()[-3000:]

        producer = DelayProducer(app_login, settings=settings)
        sent_ms = time.time() * 1000
        dropped = producer.produce(target, b"cancelled", b"k", delay=4)
        producer.produce(target, b"level", b"k", delay=4)
        exact = producer.produce(target, b"exact", b"e", delay=3, precision="exact")
        assert producer.flush(30) == 0
        reply = producer.cancel(dropped, wait=30)
        assert reply.outcome == "cancelled", reply
        assert exact

        records = _read(broker.login("admin"), target, {b"level", b"exact"}, 60)
        values = {m.value(): m for m in records}
        assert b"cancelled" not in values
        assert values[b"level"].timestamp()[1] >= sent_ms + 4000
        assert values[b"exact"].timestamp()[1] >= sent_ms + 3000
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            code = daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            code = daemon.wait()
    said = log_file.read_text()
    assert "AUTHORIZATION" not in said.upper(), said[-3000:]
    assert code == 0, said[-3000:]
