"""The read-through gate: what the wheel hands out waits until the intake has read every
record appended up to `lead_s` before its fire time, whatever stopped the daemon."""

from __future__ import annotations

import threading
import time
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewPartitions

from delayservice.precise.storage.slot_record import SlotRecord
from delayservice.precise.wheel.read_through import TICK_S, UNREAD, ReadThrough, ReadThroughRounds
from delayservice.precise.wheel.slot_buffer import SlotBuffer
from delayservice.precise.wheel.slot_ledger import SlotTracker
from tests.conftest import wait_for
from tests.precise.test_precise_worker_faults import _record

# -- the gate ----------------------------------------------------------------------


def test_nothing_may_go_before_the_first_round_and_the_gate_never_moves_back() -> None:
    gate = ReadThrough(lead_s=1.0)
    moves: list[tuple[float, float]] = []
    gate.on_move(lambda old, new: moves.append((old, new)))
    assert gate.limit_s() == UNREAD
    assert gate.lag_s(100.0) == float("inf")
    gate.advance(50.0)
    gate.advance(40.0)  # a round that began earlier, answered later
    gate.advance(50.0)
    # A marker stamped 49.999 s was read; one stamped 50.000 s may not have been: a
    # record due at 51.000 s waits for the next round.
    assert gate.limit_s() == 51.0 - TICK_S
    assert gate.lag_s(100.0) == 50.0
    assert moves == [(UNREAD, 51.0 - TICK_S)]


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _records(buffer: SlotBuffer, *fires: float) -> list[SlotRecord]:
    tracker = SlotTracker(0, 100)
    records = [_record(offset, tracker, f"m{offset}") for offset in range(len(fires))]
    buffer.schedule_many(list(zip(records, fires, strict=True)))
    return records


def _gated(clock: _Clock) -> tuple[SlotBuffer, ReadThrough]:
    """A buffer behind a gate with a second's lead, wired as `Wheel.read_through` does."""
    buffer = SlotBuffer(clock, topic="timers")
    gate = ReadThrough(lead_s=1.0)
    buffer.read_through(gate.limit_s)
    gate.on_move(buffer.limit_moved)
    return buffer, gate


def test_the_buffer_hands_out_only_what_fires_within_the_limit() -> None:
    buffer, gate = _gated(_Clock(100.0))
    first, second = _records(buffer, 90.0, 95.0)
    assert buffer.take(10) == []  # no round yet
    assert buffer.next_due_ms() is None  # the forwarder is idle meanwhile
    gate.advance(89.5)  # read through half a second before the first's fire time
    assert buffer.take(10) == [(("timers", 0), [first])]
    assert buffer.next_due_ms() is None  # the second fires past the limit
    gate.advance(100.0)
    assert buffer.next_due_ms() == 95_000
    assert buffer.take(10) == [(("timers", 0), [second])]


def test_a_taker_asleep_on_a_held_record_wakes_when_the_gate_passes_it() -> None:
    clock = _Clock(100.0)
    buffer, gate = _gated(clock)
    gate.advance(10.0)
    _records(buffer, 90.0)
    woke = threading.Event()

    def taker() -> None:
        buffer.wait(clock.now + 60)  # held: sleeps until the deadline or a wake
        woke.set()

    thread = threading.Thread(target=taker, daemon=True)
    thread.start()
    gate.advance(50.0)  # not yet past it: no wake needed
    assert not woke.wait(0.2)
    gate.advance(99.0)
    assert woke.wait(10), "the taker slept through the gate's move"
    thread.join(10)


# -- the rounds, with a fake admin client that fails as the real one does -----------


class _FailedFuture:
    """What `AdminClient.list_offsets` hands back when the broker is away: a future
    whose result raises KafkaException (librdkafka's _TRANSPORT, here)."""

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> Any:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker away"))


class _AwayAdmin:
    """Refuses as AdminClient does with its broker away: `list_topics` raises, and
    `list_offsets` hands back futures that fail; or, `metadata_cached`, it still
    answers `list_topics` from its cache (for partitions 0 and 1)."""

    def __init__(self, *, metadata_cached: bool) -> None:
        self.metadata_cached = metadata_cached
        self.asked = 0
        self.metadata_asked = 0

    def list_topics(self, topic: str, timeout: float = -1) -> Any:
        self.metadata_asked += 1
        if not self.metadata_cached:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker away"))
        return SimpleNamespace(topics={topic: SimpleNamespace(partitions={0: None, 1: None})})

    def list_offsets(self, request: dict[TopicPartition, Any], **_: Any) -> dict[Any, Any]:
        self.asked += 1
        return {tp: _FailedFuture() for tp in request}


@pytest.mark.parametrize("metadata_cached", [False, True])
def test_a_round_that_fails_is_asked_again_and_never_moves_the_gate(
    metadata_cached: bool,
) -> None:
    admin = _AwayAdmin(metadata_cached=metadata_cached)
    clock = _Clock(100.0)
    gate = ReadThrough()
    rounds = ReadThroughRounds("timers", lambda: admin, gate, clock)
    for step in range(4):
        clock.now += 1.0  # past ASK_EVERY_S each time
        rounds.step({0, 1}, lambda partitions: dict.fromkeys(partitions, 10**9))
        assert gate.through_s == UNREAD, step
    # After a failure a round reads the metadata first (the topic may have grown):
    # away, every step fails there; cached, a round is asked (first offsets and ends)
    # and its answers fail on the next step.
    assert (admin.metadata_asked, admin.asked) == ((2, 4) if metadata_cached else (4, 0))


# -- the rounds, on the real broker ------------------------------------------------


@pytest.mark.kafka
def test_rounds_move_the_gate_once_the_reader_has_read_what_was_appended_before(testbed):
    """Three partitions: one with records, one empty, one whose records were deleted
    (an unread partition may have no position at all); then an open transaction,
    which the read_committed reader cannot pass and need not, and a record appended
    after a round began, which holds the gate until it is read."""
    topic = testbed.create_topic(f"rt-{testbed.tag}", partitions=3)
    producer = Producer({"bootstrap.servers": testbed.bootstrap})
    for partition, count in ((0, 5), (2, 4)):
        for _ in range(count):
            producer.produce(topic, b"r", partition=partition)
    assert producer.flush(30) == 0
    deleted = testbed.admin.delete_records([TopicPartition(topic, 2, 4)])
    for future in deleted.values():
        future.result(30)
    consumer = Consumer(
        {
            "bootstrap.servers": testbed.bootstrap,
            "group.id": f"rt-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(3)])
    gate = ReadThrough(lead_s=0.0)
    rounds = ReadThroughRounds(
        topic, lambda: AdminClient({"bootstrap.servers": testbed.bootstrap}), gate, time.time
    )
    reading = {0, 1, 2}  # grown below

    def read_to(partitions: list[int]) -> dict[int, int]:
        return {
            tp.partition: tp.offset
            for tp in consumer.position([TopicPartition(topic, p) for p in partitions])
        }

    def answered() -> bool:
        rounds.step(reading, read_to)
        return rounds.asked_ends is not None

    def through(mark: float) -> bool:
        rounds.step(reading, read_to)
        return gate.through_s >= mark

    try:
        started = time.time()
        wait_for(answered, 10, "a round's answers")
        assert rounds.asked_ends == {0: (0, 5), 1: (0, 0), 2: (4, 4)}
        assert gate.through_s == UNREAD  # partition 0 is unread

        read = 0
        while read < 5:
            read += len(consumer.consume(10, 1.0))
        wait_for(lambda: through(started), 10, "the gate past the first round")

        transactional = Producer(
            {"bootstrap.servers": testbed.bootstrap, "transactional.id": f"rt-{testbed.tag}"}
        )
        transactional.init_transactions(30)
        transactional.begin_transaction()
        transactional.produce(topic, b"open", partition=1)
        assert transactional.flush(30) == 0
        opened = time.time()
        wait_for(lambda: through(opened), 10, "the gate past an open transaction")

        producer.produce(topic, b"late", partition=0)
        assert producer.flush(30) == 0
        appended = time.time()
        wait_for(
            lambda: answered() and rounds.asked_ends[0][1] == 6,  # type: ignore[index]
            10,
            "a round that knows of the record appended last",
        )
        assert gate.through_s < appended  # unread: its round holds
        while not consumer.consume(10, 1.0):
            pass
        wait_for(lambda: through(appended), 10, "the gate past the record, once read")
        transactional.abort_transaction(30)

        # The topic grows: the admin client's metadata lacks the new partitions until
        # it is read again (librdkafka: _UNKNOWN_PARTITION for five minutes otherwise).
        grown = testbed.admin.create_partitions([NewPartitions(topic, 5)])
        for future in grown.values():
            future.result(30)
        consumer.incremental_assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in (3, 4)])
        reading = {0, 1, 2, 3, 4}
        producer.list_topics(topic, timeout=10)  # the producer's metadata lags as well
        producer.produce(topic, b"new", partition=4)
        assert producer.flush(30) == 0
        added = time.time()
        wait_for(
            lambda: answered() and set(rounds.asked_ends or ()) == reading,
            20,
            "a round over the grown topic",
        )
        while not consumer.consume(10, 1.0):
            pass
        wait_for(lambda: through(added), 20, "the gate past the grown topic's records")
    finally:
        consumer.close()
