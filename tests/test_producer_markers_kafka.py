"""cancel() and reschedule() say what the daemon did: at once with `wait=`, or later
through the receipt they return, on a real broker with a real precise daemon."""

from __future__ import annotations

import time

import pytest

from delayservice.markers.receipt import MarkerReceipt, NoReplyError
from tests.precise.test_precise_daemon import _exact_producer, _headers, _precise
from tests.precise.test_precise_markers_daemon import _records_in

pytestmark = pytest.mark.kafka


def test_cancel_and_reschedule_return_the_daemons_reply(testbed, tmp_path):
    settings = _precise(testbed, tmp_path)
    target = testbed.create_topic(f"replies-{testbed.tag}")
    daemon = testbed.start_daemon(settings)
    testbed.wait_assigned(daemon, partitions=settings.partitions)
    producer = _exact_producer(testbed, settings)
    moved = producer.produce(target, b"moved", delay=60)
    kept = producer.produce(target, b"kept", delay=60)
    assert producer.flush(10) == 0

    asked_ms = time.time() * 1000
    reply = producer.reschedule(moved, delay="2s", wait=30)
    assert (reply.outcome, reply.applied, reply.message_id) == ("moved", True, moved)
    assert reply.due_ms is not None
    assert reply.due_ms >= asked_ms + 2000

    # Without wait: a receipt at once, asked only once its reply is surely written.
    receipt = producer.cancel(kept)
    assert isinstance(receipt, MarkerReceipt)
    topic, partition, _offset = receipt.landed(10)
    assert (topic, partition) == (settings.precise_topic, int(kept.rsplit("-p", 1)[1]))
    testbed.wait_for(
        lambda: _records_in(testbed, settings.precise_outcomes_topic) >= 2,
        30,
        "the daemon's reply to the cancel",
    )
    assert receipt.reply(30).outcome == "accepted"

    (forwarded,) = testbed.collect(target, 1, timeout=30)
    assert _headers(forwarded)["delay-id"].decode() == moved
    late = producer.cancel(moved, wait=30)
    assert (late.outcome, late.applied) == ("too_late", False)
    unmatched = producer.reschedule("0123456789abcdef0123456789abcdef-p0", delay=1, wait=30)
    assert unmatched.outcome == "unmatched"


def test_no_reply_in_time_is_a_timeout_naming_where_the_marker_is(testbed, tmp_path):
    """No daemon runs: the marker is written, the reply never comes."""
    settings = _precise(testbed, tmp_path)
    producer = _exact_producer(testbed, settings)
    message_id = producer.produce(f"t-{testbed.tag}", b"v", delay=60)
    started = time.monotonic()
    with pytest.raises(NoReplyError, match="no reply within 2 s; the marker is on") as caught:
        producer.cancel(message_id, wait=2)
    assert isinstance(caught.value, TimeoutError)
    assert caught.value.retriable
    assert 2 <= time.monotonic() - started < 15


def test_waiting_without_the_outcomes_topic_fails_before_anything_is_sent(testbed):
    from delayservice.markers.outcome import RepliesUnavailableError

    settings = testbed.settings(levels="1s", precise_topic=f"nope-{testbed.tag}")
    producer = _exact_producer(testbed, settings)
    with pytest.raises(RepliesUnavailableError, match="outcomes topic"):
        producer.cancel("0123456789abcdef0123456789abcdef-p0", wait=5)
    assert len(producer) == 0
