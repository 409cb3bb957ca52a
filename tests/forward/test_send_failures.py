"""What a send that fails past a full queue, or a producer that goes fatal, does to the
records taken: every one is sent, dead-lettered or read again, never dropped.

The fake producer refuses what librdkafka refuses (`tests/level/fakes.py`): produce()
with `_STATE` once a failed delivery made the transaction abortable, with `_FATAL` once
the producer went fatal, whose error is raised once from the poll or flush that serves
it. A forwarder waiting for room in a full queue (`BufferError`) polls; what it polls
can change what the next produce() gets.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, KafkaException

from delayservice.forward import forwarder as forwarder_module
from delayservice.forward import producer_rebuild
from tests.forward.test_commit_path import GUARANTEES, committed, rig_for, run
from tests.level import fakes
from tests.level.fakes import (
    LEVEL_TOPIC,
    TARGET,
    FakeClock,
    FakeProducer,
    LevelRig,
    Sent,
    kafka_error,
)
from tests.level.test_consumer_loop import append, forwarded
from tests.precise.forward_rig import make_precise_rig

RECORDS = 10


def full_at(
    delay_id: str, *, attempts: int = 1, then: Callable[[Sent], None] | None = None
) -> Callable[[Sent], None]:
    """An `on_produce` that finds the local queue full for `delay_id`'s first `attempts`
    attempts (the forwarder polls between them); `then(sent)` runs at the next one
    (while the forwarder waited, something changed)."""
    seen = {"n": 0}

    def on_produce(sent: Sent) -> None:
        if sent.delay_id != delay_id:
            return
        seen["n"] += 1
        if seen["n"] <= attempts:
            raise BufferError("Local: Queue full")
        if seen["n"] == attempts + 1 and then is not None:
            then(sent)

    return on_produce


def replaced_by_fresh_producers(
    rig: LevelRig, clock: FakeClock, then: Callable[[FakeProducer], None] | None = None
) -> list[FakeProducer]:
    """Each producer the forwarder makes to replace a failed one is a fresh fake, owned
    by the rig's consumer (`then` sets it up); returns them as they come."""
    made: list[FakeProducer] = []

    def fresh() -> FakeProducer:
        producer = FakeProducer(dict(rig.producer.topics), clock, rig.producer.config)
        producer.owner = rig.consumer
        if then is not None:
            then(producer)
        made.append(producer)
        return producer

    rig.forwarder.rebuild.make = fresh
    return made


def all_forwarded_once(rig: LevelRig, count: int) -> None:
    seen = forwarded(rig)
    expected = [f"id-0-{offset}" for offset in range(count)]
    assert sorted(set(seen)) == sorted(expected), f"missing {sorted(set(expected) - set(seen))}"
    if rig.forwarder.transactional:
        assert len(seen) == len(set(seen)), "a read_committed reader saw a duplicate"
        # One partition, in order, each record once.
        assert seen == expected
    assert committed(rig) == {0: count}


def test_an_abortable_transaction_refusing_produce_while_the_queue_is_full_loses_nothing(
    clock: FakeClock,
) -> None:
    """A delivery fails while the forwarder waits for room: librdkafka makes the
    transaction abortable and refuses the next produce() with _STATE. The records of
    the pass not sent yet go back to their queue and are sent in the next transaction."""
    rig = rig_for(clock, True, backoff=(0.2, 1.0))
    rig.consumer.queue_rebalance("assign", 0)
    fail_first = {"id-0-2": 1}

    def outcome(sent: Sent) -> KafkaError | None:
        if fail_first.get(sent.delay_id or "", 0):
            fail_first[sent.delay_id or ""] -= 1
            return kafka_error(KafkaError._MSG_TIMED_OUT, retriable=True)
        return None

    rig.producer.outcome = outcome
    # Full at the first attempt and at the first retry: the poll between serves the
    # failed delivery, and the next produce() is refused with _STATE.
    rig.producer.on_produce = full_at("id-0-5", attempts=2)
    append(rig, 0, RECORDS)
    run(rig, clock)
    refused = [s for s in rig.producer.attempts if s.delay_id == "id-0-5"]
    assert len(refused) >= 4, "the scenario did not refuse id-0-5 with _STATE while it waited"
    for _ in range(5):
        run(rig, clock, 1.0)
    all_forwarded_once(rig, RECORDS)
    # Later records of the partition commit past nothing that was dropped.
    append(rig, 0, 3)
    run(rig, clock, 1.0)
    all_forwarded_once(rig, RECORDS + 3)


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_target_deleted_while_the_forwarder_waits_for_room_loses_nothing(
    clock: FakeClock, exactly_once: bool
) -> None:
    """The target is deleted while the forwarder waits on a full queue: the next produce()
    is refused with _UNKNOWN_TOPIC. The full parse takes the record (it is sent once the
    topic is back, or dead-lettered), and the rest of the pass is not dropped."""
    rig = rig_for(clock, exactly_once, backoff=(0.2, 1.0))
    rig.consumer.queue_rebalance("assign", 0)

    def deleted(_sent: Sent) -> None:
        raise KafkaException(KafkaError(KafkaError._UNKNOWN_TOPIC, "Local: Unknown topic"))

    rig.producer.on_produce = full_at("id-0-5", then=deleted)
    append(rig, 0, RECORDS)
    for _ in range(6):
        run(rig, clock, 1.0)
    all_forwarded_once(rig, RECORDS)


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_producer_that_goes_fatal_mid_pass_is_replaced_and_loses_nothing(
    clock: FakeClock, exactly_once: bool
) -> None:
    """An idempotence failure: librdkafka purges the queue, raises the fatal error once
    from the next poll or flush, and refuses every produce() with _FATAL (a code, not
    flagged fatal). The producer is replaced and everything not committed goes again."""
    rig = rig_for(clock, exactly_once)
    replacements = replaced_by_fresh_producers(rig, clock)
    rig.consumer.queue_rebalance("assign", 0)
    rig.producer.fatal_after = 4
    append(rig, 0, RECORDS)
    for _ in range(4):
        run(rig, clock, 1.0)
    assert len(replacements) == 1, "the fatal producer was not replaced"
    assert rig.fatal == []
    new = replacements[0]
    seen = [s.delay_id for s in new.visible(TARGET)]
    seen += [s.delay_id for s in rig.producer.visible(TARGET)]
    assert sorted(set(seen)) == sorted(f"id-0-{offset}" for offset in range(RECORDS))
    if exactly_once:
        assert len(seen) == RECORDS  # the fatal producer committed nothing
        assert new.committed_txns[-1][1] == [((LEVEL_TOPIC, 0), RECORDS)]
    else:
        assert rig.consumer.committed_offsets == {0: RECORDS}


def test_a_record_set_aside_whose_send_raises_waits_on_instead_of_vanishing(
    clock: FakeClock,
) -> None:
    """At-least-once: a refused record waits apart from its partition for its backoff.
    When it goes again, the queue is full and the target is deleted while it waits for
    room: it is not dropped, and its partition never commits past it."""
    rig = rig_for(clock, False, backoff=(0.5, 1.0))
    rig.forwarder.rebuild.make = lambda: rig.producer  # replaced by the same fake
    rig.consumer.queue_rebalance("assign", 0)
    left = {"id-0-1": 1}

    def outcome(sent: Sent) -> KafkaError | None:
        if left.get(sent.delay_id or "", 0):
            left[sent.delay_id or ""] -= 1
            return kafka_error(KafkaError._MSG_TIMED_OUT, retriable=True)
        return None

    rig.producer.outcome = outcome
    for offset in range(3):  # distinct contents: the report names its record at once
        append(rig, 0, value=f"v{offset}".encode())
    run(rig, clock)
    waiting = rig.forwarder.interval.waiting
    assert 1 in waiting.get((LEVEL_TOPIC, 0), {}), "the refused record was not set aside"

    def deleted(_sent: Sent) -> None:
        raise KafkaException(KafkaError(KafkaError._UNKNOWN_TOPIC, "Local: Unknown topic"))

    rig.producer.on_produce = full_at("id-0-1", then=deleted)
    for _ in range(4):
        run(rig, clock, 1.0)
    assert "id-0-1" in forwarded(rig)
    assert committed(rig) == {0: 3}


def test_a_precise_forward_refused_while_the_queue_is_full_stays_unsettled(
    clock: FakeClock,
) -> None:
    """The precise path has the same shape: a forward refused while it waited for room
    is not settled (dropped from its slot) but taken by the full parse."""
    rig = make_precise_rig(clock=clock)

    def deleted(_sent: Sent) -> None:
        raise KafkaException(KafkaError(KafkaError._UNKNOWN_TOPIC, "Local: Unknown topic"))

    rig.producer.on_produce = full_at("b", then=deleted)
    for mid in ("a", "b", "c"):
        rig.hold(mid)
    rig.step(3)
    clock.advance(2.0)
    rig.step(3)
    sent = [s.delay_id for s in rig.producer.reports if s.topic == TARGET and s.result is None]
    assert sorted(set(sent)) == ["a", "b", "c"]
    assert sorted(rig.settled()) == [0, 1, 2]


def test_a_forwarder_that_makes_nothing_durable_while_records_are_due_says_it_is_stalled(
    clock: FakeClock,
) -> None:
    """Readiness reads this: the producer cannot get an acknowledgement (no flush
    finishes), records are due, and after the retry budget the forwarder says why."""
    rig = rig_for(clock, False)
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 2)
    run(rig, clock)
    assert rig.forwarder.stalled(30.0) is None  # forwarded: durable
    rig.producer.hold_reports = True  # from now on nothing is acknowledged
    append(rig, 0, 2)
    run(rig, clock, 10.0)
    assert rig.forwarder.stalled(30.0) is None  # within the budget
    run(rig, clock, 25.0)
    why = rig.forwarder.stalled(30.0)
    assert why is not None
    assert why.startswith("nothing forwarded for 35s while records are due")
    rig.producer.hold_reports = False
    run(rig, clock, 1.0)
    assert rig.forwarder.stalled(30.0) is None
    assert committed(rig) == {0: 4}


def test_an_idle_forwarder_is_never_stalled(clock: FakeClock) -> None:
    rig = rig_for(clock, True)
    rig.consumer.queue_rebalance("assign", 0)
    run(rig, clock, 3600.0)
    append(rig, 0, 1, age_ms=0)  # due in 5 s
    run(rig, clock)
    assert rig.forwarder.stalled(1.0) is None


def fenced() -> KafkaException:
    return KafkaException(KafkaError(KafkaError.PRODUCER_FENCED, "fenced", fatal=True))


def test_a_producer_fenced_once_is_replaced_and_nothing_is_sent_twice(clock: FakeClock) -> None:
    """The coordinator fences a producer whose transaction outlived its timeout (this
    process was frozen): a new producer takes over and everything goes again from the
    committed offsets, so a read_committed reader sees each record once."""
    rig = rig_for(clock, True)
    replacements = replaced_by_fresh_producers(rig, clock)
    rig.consumer.queue_rebalance("assign", 0)
    rig.producer.commit_txn_raises = fenced()
    append(rig, 0, 3)
    for _ in range(3):
        run(rig, clock, 1.0)
    assert rig.fatal == []
    assert len(replacements) == 1
    seen = [s.delay_id for s in replacements[0].visible(TARGET)]
    assert seen == ["id-0-0", "id-0-1", "id-0-2"]
    assert rig.producer.committed_txns == []


def test_a_fence_that_keeps_coming_stops_the_forwarder_with_a_hint(clock: FakeClock) -> None:
    """Another live process with the same instance name fences every new producer: after
    the replacements allowed, the forwarder gives up and says what to check."""
    rig = rig_for(clock, True)

    def fences(producer: FakeProducer) -> None:
        producer.commit_txn_raises = fenced()

    replaced_by_fresh_producers(rig, clock, fences)
    rig.consumer.queue_rebalance("assign", 0)
    rig.producer.commit_txn_raises = fenced()
    append(rig, 0, 2)

    def keep_going() -> None:
        for _ in range(20):
            run(rig, clock, 1.0, passes=1)

    with pytest.raises(forwarder_module.ForwarderFatalError, match="same instance_name"):
        keep_going()
    assert len(rig.forwarder.rebuild.recent) == producer_rebuild.REBUILDS


@pytest.mark.parametrize(("exactly_once", "fatal"), [(False, False), (True, False), (False, True)])
def test_a_bare_kafka_error_from_the_poll_of_a_queue_full_wait_loses_nothing(
    clock: FakeClock, exactly_once: bool, fatal: bool
) -> None:
    """confluent-kafka can leave the `KafkaError` itself as the exception (see
    `kafka.client_errors`); `except BaseException` does not match it. Raised by the
    poll of a queue-full wait, it must still give back the records the pass took:
    none may be committed past without being forwarded."""
    rig = rig_for(clock, exactly_once, backoff=(0.2, 1.0))
    rig.consumer.queue_rebalance("assign", 0)
    code = KafkaError._FENCED if fatal else KafkaError._TRANSPORT
    error = KafkaError(code, "raised as it is", fatal=fatal)
    real_poll = rig.producer.poll
    raised: list[bool] = []
    waiting = {"on": False}

    def poll(timeout: float = 0) -> int:
        if waiting["on"] and not raised:
            raised.append(True)
            fakes.raise_bare_kafka_error(error)
        return real_poll(timeout)

    def full_once(sent: Sent) -> None:
        if sent.delay_id == "id-0-2" and not raised:
            waiting["on"] = True
            raise BufferError("Local: Queue full")

    rig.producer.poll = poll  # type: ignore[method-assign]
    rig.producer.on_produce = full_once
    replacements = replaced_by_fresh_producers(rig, clock) if fatal else []
    append(rig, 0, RECORDS)
    for _ in range(6):
        with contextlib.suppress(KafkaException):  # what the real loop reports and survives
            run(rig, clock, 1.0)
    assert raised == [True], "the scenario never raised from the wait's poll"
    producers = [rig.producer, *replacements]
    seen = [s.delay_id for p in producers for s in p.visible(TARGET)]
    missing = sorted({f"id-0-{n}" for n in range(RECORDS)} - set(seen))
    assert missing == [], f"taken, then neither forwarded nor given back: {missing}"
    if exactly_once:
        assert committed(rig) == {0: RECORDS}
    else:
        assert rig.consumer.committed_offsets == {0: RECORDS}
