"""Cancel and reschedule of level messages through the SDK, the CLI and `find`, on a
real broker with a real daemon, under both guarantees."""

from __future__ import annotations

import time
import uuid

import pytest

from delayservice.markers.level_ids import level_id, level_place
from delayservice.status.message_finder import CANCELLED, FORWARDED, find
from tests.cli.test_commands import _cli

pytestmark = pytest.mark.kafka


def _headers(record):
    return dict(record.headers() or [])


# CI runs the exactly-once row; tests/faults/test_level_markers_faults.py runs both.
@pytest.mark.parametrize(
    "guarantee", [pytest.param("at-least-once", marks=pytest.mark.long), "exactly-once"]
)
def test_level_messages_are_cancelled_and_moved_and_every_marker_is_answered(testbed, guarantee):
    settings = testbed.settings(levels="2s,6s", guarantee=guarantee)
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(
        f"lm-{testbed.tag}", 3, {"message.timestamp.type": "LogAppendTime"}
    )
    daemon = testbed.start_daemon(settings)
    testbed.wait_assigned(daemon, partitions=settings.partitions)
    producer = testbed.producer(settings)
    kept = producer.produce(target, b"kept", b"k1", delay=6)
    gone = producer.produce(target, b"gone", b"k2", delay=6)
    earlier = producer.produce(target, b"earlier", b"k3", delay=6)
    later = producer.produce(target, b"later", b"k4", delay=2)
    assert producer.flush(10) == 0
    place = level_place(gone)
    assert place is not None
    assert (place.level, 0 <= place.partition < settings.partitions) == (2, True)

    # All three markers go before any answer is awaited: `later` is due 2 s after it
    # was sent, and each marker must land before its message's due time.
    cancelling = producer.cancel(gone)
    asked = time.time() * 1000
    moving_earlier = producer.reschedule(earlier, delay=0.5)
    moving_later = producer.reschedule(later, delay=5)
    cancelled = cancelling.reply(30)
    assert (cancelled.outcome, cancelled.applied, cancelled.message_id) == ("cancelled", True, gone)
    moved_earlier = moving_earlier.reply(30)
    assert (moved_earlier.outcome, moved_earlier.applied) == ("moved", True)
    assert moved_earlier.due_ms is not None
    assert moved_earlier.due_ms >= asked + 500 - 50  # the broker's clock, not this one's
    assert moved_earlier.copy is not None
    moved_later = moving_later.reply(30)
    assert (moved_later.outcome, moved_later.due_ms is not None) == ("moved", True)

    records = testbed.collect(target, 3, timeout=60)
    by_id = {_headers(r)["delay-id"].decode(): r for r in records}
    assert set(by_id) == {kept, earlier, later}, "the cancelled one arrived, or a move twice"
    for mid, reply in ((earlier, moved_earlier), (later, moved_later)):
        arrived = by_id[mid].timestamp()[1]
        assert reply.due_ms is not None
        assert arrived >= reply.due_ms, f"{mid} arrived {reply.due_ms - arrived} ms early"
    assert by_id[earlier].timestamp()[1] < by_id[kept].timestamp()[1]
    assert int(_headers(by_id[later])["delay-due-ms"]) >= moved_later.due_ms  # type: ignore[operator]

    late = producer.cancel(kept, wait=30)
    assert (late.outcome, late.applied) == ("too_late", False)
    old = producer.cancel(uuid.uuid4().hex, wait=30)
    assert old.outcome == "unmatched"
    assert old.reason is not None
    assert "names no level" in old.reason
    nowhere = producer.cancel(level_id(9, 0), wait=30)
    assert (nowhere.outcome, nowhere.reason) == ("refused", "no level 9 here")

    now_ms = int(time.time() * 1000)
    assert find(settings, gone, now_ms - 600_000, now_ms).state == CANCELLED
    found = find(settings, earlier, now_ms - 600_000, now_ms)
    assert found.state == FORWARDED
    assert found.due_ms == moved_earlier.due_ms
    assert [m.outcome for m in found.reschedules] == ["moved"]


def test_the_cli_cancels_a_level_message_and_says_so(testbed):
    # A level long enough that the CLI's start, beside CPU hogs, comes well within the
    # lead before the due time: the answer comes at once, not at the due time.
    settings = testbed.settings(levels="30s")
    testbed.create_delay_topics(settings)
    daemon = testbed.start_daemon(settings)
    testbed.wait_assigned(daemon, partitions=settings.partitions)
    producer = testbed.producer(settings)
    mid = producer.produce(f"cli-{testbed.tag}", b"v", b"k", delay=30)
    assert producer.flush(10) == 0
    env = {
        "DELAYSERVICE_LEVELS": settings.levels,
        "DELAYSERVICE_TOPIC_PREFIX": settings.topic_prefix,
        "DELAYSERVICE_MARKERS_TOPIC": settings.markers_topic,
    }
    result = _cli("cancel", mid, "-b", testbed.bootstrap, env=env)
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.strip().splitlines()
    place = level_place(mid)
    assert place is not None
    home = place.partition % settings.partitions  # its level partition's markers partition
    assert first.startswith(f"cancel of {mid} is on {settings.markers_topic} partition {home}")
    assert second == f"cancel of {mid}: cancelled by the daemon: it will not be delivered"
    old = uuid.uuid4().hex
    result = _cli("cancel", old, "-b", testbed.bootstrap, env=env)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"delayservice: cancel of {old}: unmatched by the daemon: ")
    assert "names no level and partition" in line


def test_cancels_with_the_markers_and_a_level_topic_grown_while_the_daemon_runs_are_honoured(
    testbed,
):
    """Issue 46: an operator grows the markers topic (and its outcomes topic) and a level
    topic under a running daemon, and a fresh producer spreads its cancels over the new
    markers partitions and its messages over the new level partition at once (it reads
    the counts when it starts). Every cancel acknowledged well before its message's due
    time is honoured: none skipped on a markers partition not read, none refused as
    naming a level partition the daemon had not heard of yet; and the messages sent to
    the new level partition arrive on time, not after librdkafka's 5-minute refresh."""
    from confluent_kafka.admin import NewPartitions

    settings = testbed.settings(levels="12s")  # room for 120 cancels on a loaded host
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(f"grow-{testbed.tag}", 3)
    daemon = testbed.start_daemon(settings)
    testbed.wait_assigned(daemon, partitions=settings.partitions)
    testbed.wait_for(lambda: daemon.markers.health()[0], 30, "the first read of the markers")
    level_topic = settings.level_set().levels[0].topic
    counts = {
        settings.markers_topic: 4,
        settings.markers_outcomes_topic: 4,
        level_topic: settings.partitions + 1,
    }
    grown = [NewPartitions(topic, count) for topic, count in counts.items()]
    for future in testbed.admin.create_partitions(grown).values():
        future.result(30)

    def shown() -> bool:
        topics = testbed.admin.list_topics(timeout=10).topics
        return all(len(topics[t].partitions) == n for t, n in counts.items())

    testbed.wait_for(shown, 30, "the broker's metadata to show the added partitions")
    producer = testbed.producer(settings)  # fresh: it reads the counts as it starts
    testbed.wait_for(
        lambda: all(
            producer._partitions.known(t) == counts[t]
            for t in (level_topic, settings.markers_topic)
        ),
        30,
        "the producer's counts",
    )
    doomed, kept, landed = _cancel_most(producer, target, counts[level_topic])
    on_new = sum(1 for _, partition, _ in landed if partition > 0)
    assert on_new > 0, "no marker landed on an added partition: the test proves nothing"
    new_level = sum(1 for mid in doomed if level_place(mid).partition == settings.partitions)
    assert new_level > 0, "no message went to the added level partition: it proves nothing"
    _none_leaked(
        testbed,
        target,
        doomed,
        kept,
        f"{on_new} markers landed on added markers partitions, {new_level} cancelled "
        "messages were on the added level partition",
    )


def _cancel_most(producer, target: str, partitions: int):
    """120 messages due in 12 s, cancelled at once, and 30 kept sent after them: the
    ids cancelled, the ids kept, where each cancel landed."""
    doomed = [producer.produce(target, b"doomed", f"d{n}".encode(), delay=12) for n in range(120)]
    kept = [producer.produce(target, b"kept", f"k{n}".encode(), delay=12) for n in range(30)]
    assert producer.flush(10) == 0
    receipts = [producer.cancel(mid) for mid in doomed]
    landed = [receipt.landed(30) for receipt in receipts]
    # Acknowledged well before the due time less the lead (1 s): the promise, not the race.
    assert time.time() * 1000 < level_place(doomed[0]).sent_ms + 12_000 - 3_000, "sent too late"
    # The kept ones were sent after the doomed ones, on every level partition: once all
    # arrived, every doomed one was due and either forwarded or withdrawn.
    assert {level_place(mid).partition for mid in kept} == set(range(partitions))
    return doomed, kept, landed


def _none_leaked(testbed, target: str, doomed, kept, why: str) -> None:
    records = testbed.collect(target, len(kept), timeout=60)
    arrived = {_headers(r)["delay-id"].decode() for r in records}
    leaked = arrived & set(doomed)
    assert not leaked, f"{len(leaked)} of {len(doomed)} cancelled messages were delivered ({why})"
    assert set(kept) <= arrived


def test_cancels_after_the_markers_topic_is_deleted_and_made_again_are_honoured(testbed, caplog):
    """Issue 46: the markers topic is deleted and made again (`topics create` run again
    after a mistake) while a daemon runs. The new topic's offsets start over below
    where the reader had read the old one: its markers must be read from the new
    topic's start, with a WARNING naming it, and cancels sent to it honoured."""
    import logging

    from delayservice.kafka import topics

    caplog.set_level(logging.WARNING, logger="delayservice.level.markers.topics")
    settings = testbed.settings(levels="12s")  # room for 120 cancels on a loaded host
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(f"again-{testbed.tag}", 3)
    daemon = testbed.start_daemon(settings)
    testbed.wait_assigned(daemon, partitions=settings.partitions)
    testbed.wait_for(lambda: daemon.markers.health()[0], 30, "the first read of the markers")
    first = testbed.producer(settings)
    before = [first.cancel(level_id(1, n % settings.partitions)) for n in range(150)]
    for receipt in before:  # the old topic read well past where the new one will end
        receipt.landed(30)
    testbed.wait_for(
        lambda: sum(daemon.markers.book.kept().values()) >= 150, 30, "the old markers read"
    )
    topic = settings.markers_topic
    testbed.admin.delete_topics([topic])[topic].result(30)
    testbed.wait_for(
        lambda: topic not in testbed.admin.list_topics(timeout=10).topics, 30, "the topic gone"
    )
    made = topics.create(testbed.admin, settings)
    assert [spec.name for spec, outcome in made if outcome != "exists"] == [topic]

    def listed() -> bool:  # a topic just made reaches the broker's metadata a moment later
        meta = testbed.admin.list_topics(topic, timeout=10).topics.get(topic)
        return meta is not None and meta.error is None and bool(meta.partitions)

    testbed.wait_for(listed, 30, "the topic made again in the broker's metadata")
    producer = testbed.producer(settings)  # fresh: it writes to the new topic
    doomed, kept, _ = _cancel_most(producer, target, settings.partitions)
    _none_leaked(testbed, target, doomed, kept, "the markers topic made again")
    told = [r for r in caplog.records if "made again" in r.getMessage()]
    assert len(told) == 1, [r.getMessage() for r in caplog.records]
    assert topic in told[0].getMessage()
