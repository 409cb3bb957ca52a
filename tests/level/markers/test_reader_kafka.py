"""The markers' reader on a real broker: markers and answers reach the book, the gate
moves only past what was read, a partition holding older records makes it read again,
and answers written in transactions are read through their commit markers."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

from delayservice.envelope import H_CANCEL, H_DELAY_MS, H_RESCHEDULE, H_VERSION
from delayservice.kafka import topics
from delayservice.level.markers.gate import BLOCKED
from delayservice.level.markers.level_markers import LevelMarkers
from delayservice.markers.level_ids import level_id
from delayservice.markers.replies import MarkerReply
from delayservice.metrics.service_metrics import ServiceMetrics

pytestmark = pytest.mark.kafka


def _now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture
def registry():
    return CollectorRegistry()


@pytest.fixture
def markers(testbed, registry):
    settings = testbed.settings(levels="1s,3s")
    topics.create(testbed.admin, settings)
    made = LevelMarkers(settings, ServiceMetrics(registry), _now_ms)
    made.start()
    yield made
    made.request_stop()
    assert made.join(15)


def _send(testbed, topic: str, headers, *, key=None, value=None, transactional=False) -> None:
    config = {"bootstrap.servers": testbed.bootstrap}
    if transactional:
        config["transactional.id"] = f"t-{uuid.uuid4().hex}"
    producer = Producer(config)
    if transactional:
        producer.init_transactions(30)
        producer.begin_transaction()
    producer.produce(topic, value, key, headers=headers)
    if transactional:
        producer.commit_transaction(30)
    assert producer.flush(30) == 0


def _a_reschedule_filed(testbed, markers) -> tuple[str, Any, MarkerReply]:
    """A reschedule of a level message, in the book: (its id, its entry, the answer
    `moved` a daemon would write for it)."""
    settings = markers.settings
    mid = level_id(1, 0, _now_ms())
    _send(testbed, settings.markers_topic, [(H_RESCHEDULE, mid.encode()), (H_DELAY_MS, b"500")])
    testbed.wait_for(lambda: markers.book.has(mid), 30, "the marker in the book")
    (entry,) = markers.book.keys.values()
    answer = MarkerReply("reschedule", mid, "moved", 1, copy=f"{settings.topic_prefix}1:0")
    return mid, entry, answer


def _commit_answer(testbed, settings, entry: Any, answer: MarkerReply) -> None:
    """`answer` to the marker of `entry`, committed in a transaction of its own."""
    _send(
        testbed,
        settings.markers_outcomes_topic,
        None,
        key=entry.marker.key,
        value=answer.encode(),
        transactional=True,
    )


def _transactional(testbed) -> Producer:
    producer = Producer(
        {"bootstrap.servers": testbed.bootstrap, "transactional.id": f"t-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(30)
    return producer


def test_markers_reach_the_book_and_the_gate_passes_only_what_was_read(testbed, markers):
    settings = markers.settings
    testbed.wait_for(lambda: markers.health()[0], 30, "the first read of the markers")
    mid = level_id(2, 1, _now_ms())
    before = _now_ms()
    _send(testbed, settings.markers_topic, [(H_VERSION, b"1"), (H_CANCEL, mid.encode())])
    _send(testbed, settings.markers_topic, [(H_RESCHEDULE, mid.encode()), (H_DELAY_MS, b"x")])
    sent = _now_ms()

    def filed() -> bool:
        return markers.book.has(mid) and len(markers.book.keys) == 2

    testbed.wait_for(filed, 30, "both markers in the book")
    refused = [e for e in markers.book.keys.values() if e.refusal is not None]
    assert [e.refusal[0] for e in refused] == ["refused"]  # type: ignore[index]
    assert markers.book.watch == {(f"{settings.topic_prefix}2", 1): {mid.encode()}}
    markers.gate.want(1, sent, lambda: None)
    testbed.wait_for(lambda: markers.gate.through_ms >= sent, 30, "the gate past the markers")
    assert markers.gate.through_ms >= before


def test_answers_written_in_a_transaction_are_read_through_its_commit(testbed, markers):
    settings = markers.settings
    mid, entry, answer = _a_reschedule_filed(testbed, markers)
    _commit_answer(testbed, settings, entry, answer)
    written = _now_ms()
    testbed.wait_for(lambda: entry.marker.key in markers.book.executed, 30, "the answer read back")
    assert markers.book.copies[mid] == (f"{settings.topic_prefix}1", 0)
    testbed.wait_for(
        lambda: markers.gate.outcomes_through_ms >= written,
        30,
        "the outcomes read past the transaction's commit marker",
    )
    assert json.loads(answer.encode())["copy"] == f"{settings.topic_prefix}1:0"


def test_an_answer_in_a_transaction_still_open_holds_back_what_the_answers_vouch_for(
    testbed, markers, registry
):
    """A new owner takes its predecessor's moves as known once `outcomes_through_ms`
    passes the time it took the partition. The transaction that carried a move was
    committed before then (its offsets held the partition), but the broker writes its
    commit markers after the commit returns, partition by partition: the offsets may
    come free before the answer is readable. Read to the last stable offset, the
    reader vouched for a time at which the answer was written and not yet read, and
    the new owner moved the message again. Read to the end of the log, it waits."""
    settings = markers.settings
    _mid, entry, answer = _a_reschedule_filed(testbed, markers)
    producer = _transactional(testbed)
    producer.begin_transaction()
    producer.produce(settings.markers_outcomes_topic, answer.encode(), entry.marker.key)
    assert producer.flush(30) == 0
    written = _now_ms()
    testbed.wait_for(
        lambda: markers.gate.through_ms > written + 1_000, 30, "the markers read on meanwhile"
    )
    assert markers.gate.outcomes_through_ms < written, "vouched for an answer not read"
    assert entry.marker.key not in markers.book.executed
    lag = registry.get_sample_value("delayservice_level_markers_answers_lag_seconds")
    assert lag is not None
    assert lag >= 1.0, f"the answers' lag says {lag} s"
    producer.commit_transaction(30)
    committed = _now_ms()
    testbed.wait_for(
        lambda: markers.gate.outcomes_through_ms >= committed, 30, "the answers read on"
    )
    assert entry.marker.key in markers.book.executed


def test_a_transaction_left_open_by_a_dead_member_does_not_hide_answers_committed_after_it(
    testbed, markers
):
    """A member killed with answers in its open transaction pins the outcomes
    partition's last stable offset until the broker aborts it (`transaction.timeout.ms`):
    answers other members commit meanwhile sit above it, unreadable read_committed.
    Read to the stable end, the reader vouched for times past their commits without
    them, and a new owner moved again what they say was moved (row 28 per-level: two
    committed copies of a message, their answers ten seconds apart). Read to the end of
    the log, it vouches for nothing past the open transaction until it ends."""
    settings = markers.settings
    _mid, entry, answer = _a_reschedule_filed(testbed, markers)
    dead = _transactional(testbed)
    dead.begin_transaction()
    other = MarkerReply("cancel", level_id(1, 0, _now_ms()), "cancelled")
    dead.produce(settings.markers_outcomes_topic, other.encode(), b"another-marker")
    assert dead.flush(30) == 0
    _commit_answer(testbed, settings, entry, answer)
    committed = _now_ms()
    testbed.wait_for(
        lambda: markers.gate.through_ms > committed + 1_000, 30, "the markers read on meanwhile"
    )
    assert entry.marker.key not in markers.book.executed  # above the stable end
    assert markers.gate.outcomes_through_ms < committed, "vouched for an answer not read"
    dead.abort_transaction(30)
    ended = _now_ms()
    testbed.wait_for(lambda: markers.gate.outcomes_through_ms >= ended, 30, "the answers read on")
    assert entry.marker.key in markers.book.executed


def test_records_older_than_what_was_read_make_it_read_again(testbed, markers):
    settings = markers.settings
    old = level_id(2, 0, _now_ms())
    _send(testbed, settings.markers_topic, [(H_CANCEL, old.encode())])
    testbed.wait_for(lambda: markers.book.has(old), 30, "the marker in the book")
    appended = next(iter(markers.book.keys.values())).marker.appended_ms
    markers.book.expire(appended + 1)  # forgotten, as if it were long ago
    markers.gate.forget_before(appended + 1)
    assert not markers.book.has(old)
    markers.gate.need((f"{settings.topic_prefix}2", 0), appended + markers.gate.lead_ms - 5)
    assert markers.gate.through_ms == BLOCKED
    testbed.wait_for(lambda: markers.book.has(old), 30, "the marker read again")
    testbed.wait_for(lambda: markers.gate.through_ms > appended, 30, "the gate open again")
