"""`find` and `pending` read whatever the topics hold: hostile bytes written by a client
not written in Python (through librdkafka's C API) must neither crash them nor hide the
messages around them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from delayservice.cli.app import app
from delayservice.settings_loading import settings_env
from tests.faults.test_hostile_headers import KINDS
from tests.kafka.raw_producer import RawProducer

pytestmark = pytest.mark.kafka


def _cli(settings: Any, *args: str) -> Any:
    return CliRunner().invoke(app, list(args), env=settings_env(settings), catch_exceptions=False)


def test_find_and_pending_read_past_every_hostile_record(testbed):
    settings = testbed.settings(levels="1h", partitions=1)  # one partition: known offsets
    testbed.create_delay_topics(settings)
    (level,) = list(settings.level_set())
    target = testbed.create_topic(f"target-{testbed.tag}")
    envelope = [(b"delay-v", b"1"), (b"delay-target", target.encode()), (b"delay-ms", b"3600000")]
    with RawProducer(testbed.bootstrap) as raw:
        for kind in KINDS.values():
            raw.produce(level.topic, kind.value, kind.key, [*kind.headers, *envelope], 0)
        raw.produce(level.topic, b"v", b"k", [*envelope, (b"delay-id", b"\xff\xfe")], 0)
        raw.produce(level.topic, b"v", b"k", [(b"delay-id", None)], 0)
        raw.flush()
    with testbed.producer(settings) as producer:
        good = producer.produce(target, b"good", delay=3600)
        producer.flush(10)

    found = _cli(settings, "find", good, "--json", "--since", "10m")
    assert found.exit_code == 0, found.output
    where = json.loads(found.stdout)
    assert where["state"] == "waiting"
    assert where["source"]["offset"] == len(KINDS) + 2  # after every hostile record
    assert where["records_read"] >= len(KINDS) + 3

    missing = _cli(settings, "find", "not-an-id", "--since", "10m")
    assert missing.exit_code == 1
    assert "not found" in missing.stdout

    pending = json.loads(_cli(settings, "pending", "--json").stdout)
    (row,) = pending["rows"]
    assert row["waiting"] == len(KINDS) + 3
    assert row["next_due_ms"] is not None
