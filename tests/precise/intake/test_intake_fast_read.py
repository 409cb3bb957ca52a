"""The intake reads the common record without the full envelope parse (`plain_tail`,
`Admission.plain`). What it stores must be exactly what the full read would store, and
every other record must still take the full read."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, Message
from prometheus_client import CollectorRegistry

from delayservice.envelope import Envelope
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.precise.intake.admission import Admission
from delayservice.precise.precise_worker import PreciseLevel
from delayservice.precise.storage.slot_file import StoredRecord, decode
from tests.level.fakes import message
from tests.precise.intake_rig import FAR_MS, NOW_MS, TOPIC, Rig, record, running


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with running(tmp_path) as made:
        yield made


def _stored(root: Path) -> dict[str, StoredRecord]:
    return {
        held.message_id: held
        for path in (root / "slots").rglob("*")
        if path.is_file()
        for held in decode(path.read_bytes())[0]
    }


def _exact(offset: int, envelope: Envelope, user: list | None = None, **kw: object) -> Message:
    headers = [*(user or []), *envelope.headers()]
    return message(0, offset, kw.pop("stamp", NOW_MS), headers=headers, topic=TOPIC, **kw)  # type: ignore[arg-type]


def test_what_the_fast_read_stores_is_what_the_full_read_would(rig):
    batch = [
        record(0),
        _exact(1, Envelope("orders", FAR_MS, "user-headers"), [("trace", b"t"), ("empty", None)]),
        _exact(2, Envelope("orders", FAR_MS, "due-later", None, NOW_MS + 2 * FAR_MS)),
        _exact(3, Envelope("orders", FAR_MS, "due-earlier", None, NOW_MS + 10)),
        _exact(4, Envelope("orders", FAR_MS, "to-partition", 2)),
        _exact(5, Envelope("orders", FAR_MS, "no-key"), key=None, value=None),
    ]
    rig.run_batch(batch)
    stored = _stored(rig.root)
    full = Admission(PreciseLevel(0, 0, TOPIC), 86_400_000, frozenset({TOPIC}), _metrics())
    for sent in batch:
        expected = full.hold(sent, None, now_ms=NOW_MS + 1)
        assert expected.envelope is not None
        assert expected.problem is None
        held = stored[expected.envelope.id]
        assert held.due_ms == expected.due_ms
        assert (held.target, held.delay_ms, held.target_partition) == (
            expected.envelope.target,
            expected.envelope.delay_ms,
            expected.envelope.partition,
        )
        assert (held.key, held.value, held.headers) == (sent.key(), sent.value(), expected.user)
    assert stored["due-later"].due_ms == NOW_MS + 2 * FAR_MS
    assert stored["due-earlier"].due_ms == NOW_MS + FAR_MS


def test_a_timestamp_the_broker_did_not_write_takes_the_full_read(rig):
    """Its due time counts from the time of reading, never from the producer's clock."""
    before = int(time.time() * 1000)
    rig.run_batch(
        [
            _exact(
                0,
                Envelope("orders", FAR_MS, "create-time"),
                stamp=before - 600_000,
                timestamp_type=TIMESTAMP_CREATE_TIME,
            )
        ]
    )
    after = int(time.time() * 1000)
    held = _stored(rig.root)["create-time"]
    assert before + FAR_MS <= held.due_ms <= after + FAR_MS
    counted = rig.metrics.level_mismatches.labels("exact", "not_append_time")._value.get()
    assert counted == 1


def _metrics() -> ServiceMetrics:
    return ServiceMetrics(CollectorRegistry())
