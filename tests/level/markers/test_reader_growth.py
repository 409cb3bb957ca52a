"""Partitions added to the markers topic or its outcomes topic while the reader runs
(an operator grew the topic; the SDK then spreads markers over every partition it
has): the reader assigns them from their beginning, and the gate does not move past a
pass's time until they were read to their end as of that pass. It says so once, at
WARNING. The reader runs on the test's own thread, one pass at a time, over fakes: its
reading consumer, which knows of the partitions it listed itself (librdkafka's metadata
cache), and the second one it lists the topics with."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME as CREATE

from delayservice.envelope import H_DELAY_MS, H_RESCHEDULE
from delayservice.level.markers import filing as marker_filing
from delayservice.level.markers import topics as marker_topics
from delayservice.markers.level_ids import level_id
from delayservice.markers.replies import RESCHEDULE, MarkerReply, reply_key
from tests.level.fakes import message
from tests.level.markers.reading import Reading, cancel_on, reading_rig


@pytest.fixture
def reading(monkeypatch: pytest.MonkeyPatch) -> Reading:
    return reading_rig(monkeypatch)


def _grew(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "grew" in r.getMessage()
    ]


def test_a_marker_on_a_partition_added_while_reading_is_read_before_the_gate_passes_it(
    reading: Reading, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="delayservice.level.markers.topics")
    reading.grow(reading.markers, 4)
    mid = cancel_on(reading, 3)
    acknowledged = reading.clock.ms()
    before = reading.gate.through_ms
    # The new partition's records are not fetched yet: the pass cannot finish.
    reading.fake.paused_tps.add((reading.markers, 3))
    reading.one_pass()
    assert reading.gate.through_ms <= before, (
        f"the gate moved to {reading.gate.through_ms}, past a cancel acknowledged at "
        f"{acknowledged} on a partition it has not read"
    )
    reading.fake.paused_tps.clear()
    reading.one_pass()
    assert reading.book.has(mid), (
        f"the gate is at {reading.gate.through_ms}, past a cancel acknowledged at "
        f"{acknowledged} on a partition added while it ran, and that cancel was never read"
    )
    assert reading.gate.through_ms > acknowledged
    later = cancel_on(reading, 2)
    reading.one_pass()
    assert reading.book.has(later)
    (line,) = _grew(caplog)
    assert f"{reading.markers} grew from 1 to 4 partitions" in line


def test_the_outcomes_known_wait_for_an_outcomes_partition_added_while_reading(
    reading: Reading, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="delayservice.level.markers.topics")
    reading.grow(reading.outcomes, 2)
    tp = (reading.outcomes, 1)
    reading.fake.append(tp, message(1, 0, reading.clock.ms(), topic=reading.outcomes))
    before = reading.gate.outcomes_through_ms
    reading.fake.paused_tps.add(tp)
    reading.one_pass()
    assert reading.gate.outcomes_through_ms <= before, "answers known past one never read"
    assert reading.gate.through_ms > before  # the markers were all read: they move
    reading.fake.paused_tps.clear()
    reading.one_pass()
    assert reading.reader._read_to[tp] == 1
    # Read through the time of the pass that found it, which kept its target since.
    assert before < reading.gate.outcomes_through_ms <= reading.gate.through_ms
    reading.one_pass()
    assert reading.gate.outcomes_through_ms == reading.gate.through_ms
    (line,) = _grew(caplog)
    assert f"{reading.outcomes} grew from 1 to 2 partitions" in line


def test_a_markers_topic_made_again_is_read_from_its_start_and_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 46: the markers topic deleted and made again starts its offsets over. A
    pass that compared the new topic's ends with where the old one was read would move
    the gate past markers never read; the reader reads the new topic from its start."""
    reading = reading_rig(monkeypatch)
    reader, book, gate = reading.reader, reading.book, reading.gate
    reader._thread.is_alive = lambda: True  # type: ignore[method-assign]
    ids = {reading.markers: "m-1", reading.outcomes: "o-1"}
    reader.topics.topic_ids = lambda names: {name: ids[name] for name in names}
    reader.topics.ids.update(ids)  # as the reader saw them when it opened
    old = [cancel_on(reading, 0) for _ in range(5)]
    reading.one_pass()
    assert all(book.has(mid) for mid in old)
    through = gate.through_ms

    reading.fake.logs[(reading.markers, 0)] = []  # deleted, and made again
    ids[reading.markers] = "m-2"
    new = cancel_on(reading, 0)  # offset 0 of the new topic, below where the old was read
    with pytest.raises(marker_topics.TopicRemadeError):
        reading.one_pass()
    assert gate.through_ms == through, "the gate moved past the new topic unread"
    ready, why = reader.health()
    assert not ready
    assert f"{reading.markers} was deleted and made again" in why
    reading.consumer = reader._open()  # as the reader's loop does
    reading.one_pass()
    assert book.has(new), "the cancel on the topic made again was never read"
    assert all(book.has(mid) for mid in old), "cancels acknowledged before were forgotten"
    assert gate.through_ms > through
    assert reader.health() == (True, "markers: read")
    told = [r.getMessage() for r in caplog.records if "made again while" in r.getMessage()]
    assert len(told) == 1
    assert reading.markers in told[0]


def test_a_cancel_of_a_message_on_a_level_partition_added_since_the_counts_is_kept(
    reading: Reading,
) -> None:
    """A level topic grown while the reader runs: a fresh producer sends to the new
    partition and cancels at once, before the reader's next reading of the counts (every
    `METADATA_S`). The cancel was refused as naming a partition the topic does not have,
    and its message delivered; the counts are read again first."""
    level = reading.reader.filing.level_topics[0]
    assert reading.book.partitions[level] == 3
    reading.fake.partition_counts[level] = 4
    mid = cancel_on(reading, 0, names=3)
    reading.one_pass()
    assert reading.book.partitions[level] == 4
    (entry,) = reading.book.entries((level, 3))
    assert entry.marker.message_id == mid
    assert entry.refusal is None, f"refused: {entry.refusal}"


def test_a_cancel_naming_a_partition_the_topic_lacks_is_refused_on_counts_read_after_it(
    reading: Reading,
) -> None:
    """The counts are read again for it, once a batch, and it is refused on them."""
    level = reading.reader.filing.level_topics[0]
    asked: list[str] = []
    lister = reading.reader._ends.lister
    listed = lister.list_topics

    def counted(topic: str | None = None, timeout: float = -1) -> object:
        asked.append(str(topic))
        return listed(topic, timeout)

    lister.list_topics = counted
    junk = [cancel_on(reading, 0, names=7) for _ in range(3)]
    reading.one_pass()
    assert asked.count(level) == 1, asked  # once for the batch, not once a marker
    refused = reading.book.entries(reading.book.answers_tp)
    assert {e.marker.message_id for e in refused} == set(junk)
    assert all(e.refusal is not None and "no partition 7" in e.refusal[1] for e in refused)


def test_counts_that_cannot_be_read_again_leave_the_marker_to_a_fresh_read(
    reading: Reading,
) -> None:
    """A broker that does not answer the counts: the pass ends with the marker unfiled
    and the gate where it was; the reader's loop opens a fresh consumer, which reads it."""
    from confluent_kafka import KafkaError, KafkaException

    level = reading.reader.filing.level_topics[0]
    lister = reading.reader._ends.lister
    listed = lister.list_topics

    def down(topic: str | None = None, timeout: float = -1) -> object:
        if topic == level:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "down"))
        return listed(topic, timeout)

    lister.list_topics = down
    reading.fake.partition_counts[level] = 4
    mid = cancel_on(reading, 0, names=3)
    through = reading.gate.through_ms
    with pytest.raises(marker_filing.CountsUnreadError):
        reading.one_pass()
    assert reading.gate.through_ms == through
    assert not reading.book.has(mid)
    lister.list_topics = listed
    reading.consumer = reading.reader._open()  # as the reader's loop does
    reading.one_pass()
    (entry,) = reading.book.entries((level, 3))
    assert entry.marker.message_id == mid
    assert entry.refusal is None


def test_a_bare_kafka_error_from_consume_leaves_the_reader_reading(reading: Reading) -> None:
    """confluent-kafka can leave a bare `KafkaError` as the exception of a call that
    serves callbacks (`kafka.client_errors`); from the reader's `consume()` it went
    through every `except` and ended the thread, and with it the gate: no level record
    would have gone out again. The turn closes the consumer and the next opens afresh."""
    from confluent_kafka import KafkaError

    from tests.level.fakes import raise_bare_kafka_error

    consume = reading.consumer.consume

    def bare(num_messages: int = 1, timeout: float = -1) -> list[object]:
        raise_bare_kafka_error(KafkaError(KafkaError._TRANSPORT, "left bare"))
        return []

    reading.consumer.consume = bare
    reading.reader._next_pass = 0
    mid = cancel_on(reading, 0)
    reading.clock.advance(0.2)
    assert reading.reader._turn(reading.consumer) is None  # no exception escaped
    assert reading.consumer.closed
    reading.consumer.consume = consume
    reading.consumer.closed = False
    reading.reader._next_pass = 0
    reopened = reading.reader._turn(None)
    assert reopened is not None
    reading.reader._next_pass = 0
    reading.clock.advance(0.2)
    reading.reader._turn(reopened)
    assert reading.book.has(mid)


@pytest.mark.parametrize("tail", ["9" * 5_000, "²", "١٢"], ids=["huge", "superscript", "arabic"])
def test_a_hostile_partition_tail_is_no_level_id_and_is_answered(
    reading: Reading, tail: str
) -> None:
    """An id whose tail after its last `p` is thousands of digits (past `int()`'s limit)
    or digits that are not ASCII: the reader's look at the tail neither raises nor
    skips it; the book files it as naming no level partition, to be answered."""
    from confluent_kafka import TIMESTAMP_CREATE_TIME

    from delayservice.envelope import H_CANCEL

    mid = f"{'0' * 32}-l1p{tail}"
    assert not reading.book.beyond_count(mid)
    tp = (reading.markers, 0)
    reading.fake.append(
        tp,
        message(
            0,
            reading.fake.next_offset(tp),
            reading.clock.ms(),
            topic=reading.markers,
            headers=[(H_CANCEL, mid.encode())],
            timestamp_type=TIMESTAMP_CREATE_TIME,
        ),
    )
    reading.one_pass()
    refused = reading.book.entries(reading.book.answers_tp)
    assert [e.marker.message_id for e in refused] == [mid]
    assert refused[0].refusal is not None


def test_a_consumer_that_refuses_to_close_at_a_rewind_leaves_the_reader_reading(
    reading: Reading,
) -> None:
    """A rewind closes the reading consumer for a fresh one; one whose close() raises
    is left behind and the next turn opens a fresh one, the thread going on."""
    reader, gate = reading.reader, reading.gate
    assert gate.covered_from_ms is not None
    gate.need(("delay_topic_1", 0), gate.covered_from_ms - 60_000)  # older records
    assert gate.rewind_asked()

    def refuses() -> None:
        raise RuntimeError("close refused")

    reading.consumer.close = refuses
    assert reader._turn(reading.consumer) is None  # nothing escaped the turn
    reading.consumer.closed = False
    del reading.consumer.close  # the fake's own again, for the fresh one
    reader._next_pass = 0
    reopened = reader._turn(None)
    assert reopened is not None
    assert not gate.rewind_asked()


def test_a_rewind_takes_no_answer_as_known_until_the_outcomes_are_read_again(
    reading: Reading,
) -> None:
    """A partition handed over with records older than what the reader keeps makes it
    read the window again, and the answers to the markers it had forgotten went with
    them. Until the outcomes are read again, a predecessor's move may not count as
    known (`outcomes_through_ms`, which `WorkerMarkers.decide` waits on): taken as
    known, the new owner finds the move not carried out and forwards the original,
    whose copy its predecessor made (row 28 per-level, exactly-once, delivered two
    moved messages twice)."""
    sent = reading.clock.ms()
    mid = level_id(1, 0, sent)
    marker_tp, answer_tp = (reading.markers, 0), (reading.outcomes, 0)
    offset = reading.fake.next_offset(marker_tp)
    move = [(H_RESCHEDULE, mid.encode()), (H_DELAY_MS, b"3000")]
    reading.fake.append(
        marker_tp,
        message(0, offset, sent, topic=reading.markers, headers=move, timestamp_type=CREATE),
    )
    key = reply_key(reading.markers, 0, offset)
    moved = MarkerReply(RESCHEDULE, mid, "moved", sent + 3_000, copy="delay_topic_1:0")
    reading.fake.append(
        answer_tp,
        message(
            0,
            reading.fake.next_offset(answer_tp),
            sent,
            topic=reading.outcomes,
            headers=[],
            key=key,
            value=moved.encode(),
            timestamp_type=CREATE,
        ),
    )
    reading.one_pass()
    assert reading.book.is_executed(key)

    reading.clock.advance(reading.reader._window_ms / 1000 + 1)
    reading.one_pass()
    reading.reader._forget(reading.clock.ms())
    assert not reading.book.is_executed(key), "the move was not forgotten"

    reading.gate.need(("delay_topic_1", 0), sent)  # a new owner's records, as old
    taken = reading.clock.ms()
    assert reading.reader._turn(reading.consumer) is None  # closed for a fresh one
    reading.fake.paused_tps.add(answer_tp)  # the markers come back first
    reading.consumer = reading.reader._turn(None)
    for _ in range(3):
        reading.one_pass()
    assert reading.gate.through_for(0) >= taken, "the markers were read again"
    assert not reading.book.is_executed(key)
    assert reading.gate.outcomes_through_ms < taken, (
        "the predecessor's move is taken as known while its answer is not read again"
    )
    reading.fake.paused_tps.clear()
    reading.one_pass()
    assert reading.book.is_executed(key)
    assert reading.gate.outcomes_through_ms >= taken
