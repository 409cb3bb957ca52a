"""The forwarder on fakes: on time, retried, dead-lettered, given up on, stopped.

Most tests run the forwarder on the test's thread (`send`, `submit`, `try_drain`) with
a fake clock patched into the forwarder and admission modules, so backoffs and give-up
windows are exact and nothing sleeps. The few that need the forwarder's own thread use
real time with short waits on conditions.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from delayservice.worker import admission as admission_module
from delayservice.worker import dead_letter as dead_letter_module
from delayservice.worker import forwarder as forwarder_module
from delayservice.worker.forwarder import QueueFullError
from delayservice.worker.record import HeldRecord
from tests.worker.fakes import (
    DLQ,
    LEVEL,
    LEVEL_TOPIC,
    OTHER_TARGET,
    TARGET,
    FakeClock,
    Rig,
    Sent,
    envelope_headers,
    inferred_once,
    kafka_error,
    make_rig,
    message,
    wait_for,
)

TIMED_OUT = KafkaError._MSG_TIMED_OUT


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    clock = FakeClock()
    monkeypatch.setattr(forwarder_module, "time", clock)
    monkeypatch.setattr(admission_module, "time", clock)
    monkeypatch.setattr(dead_letter_module, "time", clock)
    return clock


@pytest.fixture
def rig(clock: FakeClock) -> Rig:
    return make_rig(clock=clock, backoff=(1.0, 8.0), give_up_s=10.0)


def admit(
    rig: Rig,
    mid: str,
    *,
    partition: int = 0,
    age_ms: int = LEVEL.delay_ms,
    target: str = TARGET,
    headers: list | None = None,
    schedule: bool = True,
    **kwargs: object,
) -> HeldRecord:
    """Read one record the way the consumer loop does: hold, track, schedule."""
    ledger = rig.ledger.partitions.get(partition) or rig.ledger.assign(partition)
    offset = ledger.next_offset or 0
    if headers is None:
        headers = envelope_headers(target=target, message_id=mid)
    msg = message(partition, offset, rig.now_ms() - age_ms, headers=headers, **kwargs)
    record = rig.admission.hold(msg, ledger)
    rig.ledger.track(ledger, offset, record.size)
    if schedule and record.dead_letter is None:
        rig.scheduler.schedule(record, record.due_ms / 1000)
    return record


def committable(rig: Rig, partition: int = 0) -> int | None:
    return rig.ledger.partitions[partition].committable()


def fail_ids(*ids: str, code: int = TIMED_OUT, times: int = 10**9):
    """An outcome failing forwards of these ids (to their target) `times` times each."""
    left = dict.fromkeys(ids, times)

    def outcome(sent: Sent) -> KafkaError | None:
        if sent.topic != DLQ and left.get(sent.delay_id or "", 0) > 0:
            left[sent.delay_id or ""] -= 1
            return kafka_error(code, retriable=code == TIMED_OUT)
        return None

    return outcome


def dead_letters(rig: Rig) -> list[Sent]:
    return [s for s in rig.producer.reports if s.topic == DLQ and s.result is None]


def reason(sent: Sent) -> str:
    return sent.header("dlq-reason").decode()


# -- on time, and settled only once acknowledged ------------------------------------
def test_a_due_record_is_forwarded_unchanged_and_settles_only_on_its_ack(rig):
    rig.producer.hold_reports = True
    record = admit(rig, "a", key=b"k1", value=b"v1", headers=envelope_headers(
        message_id="a", user=[("trace", b"t-1"), ("empty", None)]
    ))  # fmt: skip
    pinned = admit(rig, "b", headers=envelope_headers(message_id="b", partition=2))
    rig.forwarder.try_drain()

    first, second = rig.producer.to(TARGET)
    assert (first.key, first.value, first.partition) == (b"k1", b"v1", None)
    assert first.headers == [
        ("trace", b"t-1"),
        ("empty", None),
        ("delay-id", b"a"),
        ("delay-due-ms", str(record.due_ms).encode()),
    ]
    assert second.partition == 2
    assert second.header("delay-due-ms") == str(pinned.due_ms).encode()
    # Sent but not acknowledged: nothing settles, the offset stays put.
    assert committable(rig) == 0
    assert rig.ledger.total_buffered == 2

    rig.producer.deliver(1)
    assert committable(rig) == 1
    rig.producer.deliver(1)
    assert committable(rig) == 2
    assert rig.ledger.total_buffered == 0
    rig.forwarder.publish_counts()
    assert rig.metric("delayservice_forwarded_total") == 2
    assert rig.metric("delayservice_lateness_seconds_count") == 2


def test_records_due_when_read_skip_the_buffer_but_leave_after_what_it_holds(rig, clock):
    held = admit(rig, "held", age_ms=LEVEL.delay_ms + 50)  # due earlier, in the buffer
    later = admit(rig, "later", partition=1, schedule=False)
    future = admit(rig, "future", partition=2, age_ms=0, schedule=False)
    rig.forwarder.forward_now([later, future])

    assert [s.delay_id for s in rig.producer.to(TARGET)] == ["held", "later"]
    assert len(rig.scheduler) == 1  # only the record not yet due waits, never sent early
    clock.advance(LEVEL.delay_ms / 1000)
    rig.forwarder.try_drain()
    assert [s.delay_id for s in rig.producer.to(TARGET)] == ["held", "later", "future"]
    assert held.due_ms < later.due_ms


def test_a_record_is_never_sent_before_its_due_time(rig, clock):
    record = admit(rig, "early", age_ms=0, schedule=False)
    assert record.due_ms == clock.ms() + LEVEL.delay_ms
    # Even a buffer that let it go early cannot make it early: send puts it back.
    rig.forwarder.send(record)
    assert rig.producer.attempts == []
    assert rig.scheduler.next_due() == record.due_ms / 1000

    clock.advance(4.999)
    rig.forwarder.try_drain()
    assert rig.producer.attempts == []
    clock.advance(0.001)
    rig.forwarder.try_drain()
    (sent,) = rig.producer.to(TARGET)
    assert sent.at * 1000 >= record.due_ms
    assert committable(rig) == 1


# -- retries --------------------------------------------------------------------------
def test_a_retriable_failure_is_retried_after_the_backoff_and_settles_only_on_the_ack(rig, clock):
    rig.producer.outcome = fail_ids("r", times=2)
    admit(rig, "r")
    rig.forwarder.try_drain()
    assert len(rig.producer.attempts) == 1
    assert committable(rig) == 0  # a failed forward is not settled

    for backoff in (1.0, 2.0):  # exponential: 1 s, then 2 s
        clock.advance(backoff - 0.001)
        rig.forwarder.try_drain()
        before = len(rig.producer.attempts)
        assert committable(rig) == 0
        clock.advance(0.001)
        rig.forwarder.try_drain()
        assert len(rig.producer.attempts) == before + 1

    assert [s.result is None for s in rig.producer.reports] == [False, False, True]
    assert committable(rig) == 1
    assert dead_letters(rig) == []
    assert rig.metric("delayservice_forward_errors_total", error="_MSG_TIMED_OUT") == 2


def test_a_retriable_error_raised_by_produce_is_retried_like_a_failed_report(rig, clock):
    calls = []

    def raise_once(sent: Sent) -> None:
        calls.append(sent)
        if len(calls) == 1:
            raise KafkaException(kafka_error(KafkaError._TRANSPORT, retriable=True))

    rig.producer.on_produce = raise_once
    admit(rig, "x")
    rig.forwarder.try_drain()
    assert rig.producer.sent == []
    assert committable(rig) == 0
    clock.advance(1.0)
    rig.forwarder.try_drain()
    assert len(rig.producer.to(TARGET)) == 1
    assert committable(rig) == 1


def test_metadata_that_cannot_be_fetched_is_retried_not_dead_lettered(rig, clock):
    rig.producer.metadata_error = KafkaException(kafka_error(KafkaError._TRANSPORT, retriable=True))
    admit(rig, "m")
    rig.forwarder.try_drain()
    clock.advance(30.0)  # past give_up_s: an outage of metadata gives up on nothing
    rig.forwarder.try_drain()
    assert rig.producer.attempts == []
    assert committable(rig) == 0
    rig.producer.metadata_error = None
    clock.advance(8.0)
    rig.forwarder.try_drain()
    assert len(rig.producer.to(TARGET)) == 1
    assert committable(rig) == 1
    assert rig.metric("delayservice_forward_errors_total", error="metadata") >= 1


# -- dead letters -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (KafkaError.UNKNOWN_TOPIC_OR_PART, "unknown_topic"),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, "not_authorized"),
        (KafkaError.MSG_SIZE_TOO_LARGE, "too_large"),
        (KafkaError.INVALID_RECORD, "rejected"),
    ],
)
def test_a_permanent_error_dead_letters_the_record_with_its_origin(rig, clock, code, expected):
    rig.producer.hold_reports = True
    rig.producer.outcome = fail_ids("p", code=code)
    admit(rig, "p", key=b"key", value=b"value", headers=envelope_headers(
        message_id="p", user=[("trace", b"t")]
    ))  # fmt: skip
    rig.forwarder.try_drain()
    rig.producer.deliver(1)  # the forward's report: refused for good

    (dead,) = rig.producer.to(DLQ)
    assert (dead.key, dead.value) == (b"key", b"value")
    assert reason(dead) == expected
    assert dead.header("dlq-detail")
    assert dead.header("dlq-origin-topic") == LEVEL_TOPIC.encode()
    assert dead.header("dlq-origin-partition") == b"0"
    assert dead.header("dlq-origin-offset") == b"0"
    assert dead.header("dlq-time-ms") == str(clock.ms()).encode()
    # The record is kept whole, envelope included, so it can be replayed.
    assert dead.header("trace") == b"t"
    assert dead.header("delay-target") == TARGET.encode()
    assert dead.header("delay-id") == b"p"
    assert committable(rig) == 0  # not before the dead letter is acknowledged

    rig.producer.deliver(1)
    assert committable(rig) == 1
    labels = {"reason": expected}
    assert rig.metric("delayservice_dead_lettered_total", **labels) == 1


def test_an_unknown_target_or_partition_is_dead_lettered_without_producing_to_it(rig):
    admit(rig, "u", target="no-such-topic")
    admit(rig, "q", headers=envelope_headers(message_id="q", partition=7))  # orders has 3
    rig.forwarder.try_drain()
    assert rig.producer.to("no-such-topic") == []
    assert rig.producer.to(TARGET) == []
    assert [reason(d) for d in dead_letters(rig)] == ["unknown_topic", "unknown_partition"]
    assert committable(rig) == 2


@pytest.mark.parametrize("how", ["report", "raise"])
def test_a_dead_letter_too_large_for_its_topic_goes_as_a_stub(rig, how):
    too_large = kafka_error(KafkaError.MSG_SIZE_TOO_LARGE)
    rig.producer.outcome = fail_ids("big", code=KafkaError.MSG_SIZE_TOO_LARGE)
    if how == "report":
        dlq_outcome = rig.producer.outcome

        def outcome(sent: Sent) -> KafkaError | None:
            if sent.topic == DLQ and sent.value is not None:
                return too_large
            return dlq_outcome(sent)

        rig.producer.outcome = outcome
    else:  # librdkafka refuses a message above message.max.bytes in produce() itself

        def on_produce(sent: Sent) -> None:
            if sent.topic == DLQ and sent.value is not None:
                raise KafkaException(too_large)

        rig.producer.on_produce = on_produce
    value = b"x" * 5000
    admit(rig, "big", key=b"kk", value=value, headers=envelope_headers(
        message_id="big", user=[("trace", b"t")]
    ))  # fmt: skip
    rig.forwarder.try_drain()

    stub = rig.producer.to(DLQ)[-1]
    assert (stub.key, stub.value) == (None, None)
    assert stub.header("dlq-stub") == b"1"
    assert reason(stub) == "too_large"
    assert stub.header("delay-id") == b"big"
    assert stub.header("dlq-original-key-bytes") == b"2"
    assert stub.header("dlq-original-value-bytes") == b"5000"
    assert stub.header("dlq-origin-offset") == b"0"
    assert stub.header("trace") is None  # no payload of any kind
    assert dead_letters(rig) == [stub]
    assert committable(rig) == 1
    assert rig.metric("delayservice_dead_letter_stubs_total") == 1
    assert rig.metric("delayservice_dead_lettered_total", reason="too_large") == 1


def test_a_failing_dead_letter_topic_keeps_the_record_unsettled_and_retries(rig, clock):
    failures = {"left": 3}

    def outcome(sent: Sent) -> KafkaError | None:
        if sent.topic == DLQ and failures["left"]:
            failures["left"] -= 1
            return kafka_error(TIMED_OUT, retriable=True)
        return None

    rig.producer.outcome = outcome
    bad = admit(rig, "bad", headers=[("no-envelope", b"1")])
    assert bad.dead_letter is not None
    rig.forwarder.submit(bad)
    for _ in range(3):
        rig.producer.poll(0)  # the consumer loop serves reports between drains
        assert committable(rig) == 0
        clock.advance(20.0)  # past give_up_s: a dead letter is never given up on
        rig.forwarder.try_drain()
    (dead,) = dead_letters(rig)
    assert reason(dead) == "invalid_envelope"
    assert len(rig.producer.to(DLQ)) == 4
    assert committable(rig) == 1
    assert rig.metric("delayservice_dead_lettered_total", reason="retries_exhausted") == 0


def test_an_ack_without_an_offset_is_not_trusted_and_the_record_goes_again(rig, clock):
    """librdkafka infers success for a message when a later one on its partition is
    acknowledged; across a target deleted and re-created that message was never
    written. The inferred report has no offset: send again, never settle on it."""
    rig.producer.inferred = inferred_once(lambda sent: sent.delay_id == "x")
    admit(rig, "x")
    rig.forwarder.try_drain()
    rig.producer.poll(0)
    assert committable(rig) == 0  # an inferred ack settles nothing
    clock.advance(1.0)
    rig.forwarder.try_drain()
    rig.producer.poll(0)
    assert [s.delay_id for s in rig.producer.to(TARGET)] == ["x", "x"]
    assert committable(rig) == 1
    assert rig.metric("delayservice_forward_errors_total", error="unconfirmed_ack") == 1


def test_a_dead_letter_acked_without_an_offset_is_sent_again(rig, clock):
    rig.producer.inferred = inferred_once(lambda sent: sent.topic == DLQ)
    bad = admit(rig, "bad", headers=[("no-envelope", b"1")])
    rig.forwarder.submit(bad)
    rig.producer.poll(0)
    assert committable(rig) == 0
    clock.advance(1.0)
    rig.forwarder.try_drain()
    rig.producer.poll(0)
    assert len(rig.producer.to(DLQ)) == 2
    assert committable(rig) == 1
    assert rig.metric("delayservice_dead_lettered_total", reason="invalid_envelope") == 1


def test_huge_target_names_are_dead_lettered_without_being_remembered(rig):
    for i in range(20):
        record = admit(rig, f"h{i}", target=f"{i}-" + "t" * 100_000)
        assert record.dead_letter is not None
        assert record.dead_letter[0] == "invalid_target"
    assert all(len(name) <= 249 for name in rig.admission.names._memo)


# -- giving up ---------------------------------------------------------------------
def retry_for(rig: Rig, clock: FakeClock, seconds: float, step: float = 1.0) -> None:
    for _ in range(round(seconds / step)):
        clock.advance(step)
        rig.forwarder.try_drain()


def test_a_record_is_given_up_only_once_its_target_acked_others_since_it_first_failed(rig, clock):
    rig.forwarder._backoff_first, rig.forwarder._backoff_max = 1.0, 1.0
    rig.producer.outcome = fail_ids("stuck")
    admit(rig, "stuck")
    rig.forwarder.try_drain()  # first failure at t0
    clock.advance(0.5)
    admit(rig, "fine")
    rig.forwarder.try_drain()  # the same target takes another record after t0
    assert committable(rig) == 0

    retry_for(rig, clock, 9.0)  # t0 + 9.5 s: still under give_up_s
    assert dead_letters(rig) == []
    assert committable(rig) == 0
    retry_for(rig, clock, 1.0)  # t0 + 10.5 s: the next failure gives up
    (dead,) = dead_letters(rig)
    assert reason(dead) == "retries_exhausted"
    assert dead.header("delay-id") == b"stuck"
    assert "accepted other records; last error: fake" in dead.header("dlq-detail").decode()
    assert committable(rig) == 2
    assert rig.metric("delayservice_dead_lettered_total", reason="retries_exhausted") == 1


def test_acks_before_the_first_failure_or_from_other_targets_do_not_give_up(rig, clock):
    rig.forwarder._backoff_first, rig.forwarder._backoff_max = 1.0, 1.0
    admit(rig, "before")
    rig.forwarder.try_drain()  # acked before the other record ever fails
    clock.advance(0.5)
    rig.producer.outcome = fail_ids("stuck")
    admit(rig, "stuck")
    rig.forwarder.try_drain()
    clock.advance(0.5)
    admit(rig, "elsewhere", target=OTHER_TARGET)
    rig.forwarder.try_drain()  # another target's ack says nothing about this one

    retry_for(rig, clock, 35.0)
    assert dead_letters(rig) == []
    assert committable(rig) == 1  # "stuck" at offset 1 holds the commit
    assert rig.ledger.partitions[0].buffered == 1


def test_give_up_counts_acks_of_the_partition_the_record_goes_to(rig, clock):
    rig.forwarder._backoff_first, rig.forwarder._backoff_max = 1.0, 1.0
    rig.producer.outcome = fail_ids("stuck")
    admit(rig, "stuck", headers=envelope_headers(message_id="stuck", partition=1))
    rig.forwarder.try_drain()
    clock.advance(0.5)
    admit(rig, "neighbour", headers=envelope_headers(message_id="neighbour", partition=2))
    rig.forwarder.try_drain()  # the target is up, but partition 1 may be the one down
    retry_for(rig, clock, 30.0)
    assert dead_letters(rig) == []

    admit(rig, "same", headers=envelope_headers(message_id="same", partition=1))
    rig.forwarder.try_drain()  # partition 1 takes others: the failure is the record's own
    retry_for(rig, clock, 1.0)
    (dead,) = dead_letters(rig)
    assert (reason(dead), dead.header("delay-id")) == ("retries_exhausted", b"stuck")
    assert committable(rig) == 3


def test_an_outage_that_fails_every_record_dead_letters_nothing(rig, clock):
    rig.producer.outcome = fail_ids("a", "b", "c")
    for mid in ("a", "b", "c"):
        admit(rig, mid)
    rig.forwarder.try_drain()
    retry_for(rig, clock, 60.0)  # six times give_up_s, and no target acknowledged anything
    assert dead_letters(rig) == []
    assert committable(rig) == 0
    assert rig.ledger.total_buffered == 3

    rig.producer.outcome = lambda _sent: None  # the broker is back
    retry_for(rig, clock, 8.0)
    assert sorted(s.delay_id for s in rig.producer.reports if s.result is None) == ["a", "b", "c"]
    assert committable(rig) == 3
    assert rig.metric("delayservice_dead_lettered_total", reason="retries_exhausted") == 0


# -- revoked partitions ----------------------------------------------------------------
@pytest.mark.parametrize("late", ["ack", "retriable", "permanent"])
def test_late_reports_for_a_revoked_partition_are_ignored(rig, clock, late):
    rig.producer.hold_reports = True
    admit(rig, "gone", partition=0)
    admit(rig, "kept", partition=1)
    rig.forwarder.try_drain()
    assert rig.ledger.revoke(0) is not None
    codes = {"retriable": TIMED_OUT, "permanent": KafkaError.UNKNOWN_TOPIC_OR_PART}
    if late != "ack":
        rig.producer.outcome = fail_ids("gone", code=codes[late])

    rig.producer.deliver()
    clock.advance(10.0)
    rig.forwarder.try_drain()
    rig.producer.deliver()

    # The new owner re-reads the record; this instance sends nothing more for it.
    assert [s.delay_id for s in rig.producer.attempts] == ["gone", "kept"]
    assert rig.ledger.total_buffered == 0
    assert rig.ledger.to_commit() == [(1, 1)]


def test_a_record_of_a_revoked_partition_is_not_sent(rig):
    admit(rig, "gone", partition=0)
    admit(rig, "kept", partition=1)
    rig.ledger.revoke(0)
    rig.forwarder.try_drain()
    assert [s.delay_id for s in rig.producer.attempts] == ["kept"]


# -- a full queue and stopping ---------------------------------------------------------
def test_a_full_queue_hands_records_back_in_order_unsettled(rig, clock):
    full = {"on": True}

    def on_produce(_sent: Sent) -> None:
        if full["on"]:
            raise BufferError("Local: Queue full")

    rig.producer.on_produce = on_produce
    for i, mid in enumerate(("a", "b", "c")):
        admit(rig, mid, age_ms=LEVEL.delay_ms + 10 - i)  # due in a, b, c order
    start = clock.monotonic()
    rig.forwarder.try_drain()
    waited = clock.monotonic() - start
    assert forwarder_module.QUEUE_FULL_WAIT_S <= waited < forwarder_module.QUEUE_FULL_WAIT_S + 0.2
    assert rig.producer.sent == []
    assert {s.delay_id for s in rig.producer.attempts} == {"a"}  # waited on the first only
    assert len(rig.scheduler) == 3
    assert committable(rig) == 0

    full["on"] = False
    rig.forwarder.try_drain()
    assert [s.delay_id for s in rig.producer.to(TARGET)] == ["a", "b", "c"]
    assert committable(rig) == 3


def test_send_raises_queue_full_and_submit_defers_instead(rig, clock):
    rig.producer.on_produce = lambda _sent: (_ for _ in ()).throw(BufferError("full"))
    good = admit(rig, "g", schedule=False)
    with pytest.raises(QueueFullError):
        rig.forwarder.send(good)
    bad = admit(rig, "b", headers=[("x", b"no envelope")])
    rig.forwarder.submit(bad)  # must neither block for long nor raise
    assert len(rig.scheduler) == 1
    rig.producer.on_produce = None
    rig.forwarder.try_drain()
    assert [reason(d) for d in dead_letters(rig)] == ["invalid_envelope"]


def test_a_stop_ends_a_wait_for_a_full_queue_at_once_leaving_records_unsettled(monkeypatch):
    monkeypatch.setattr(forwarder_module, "QUEUE_FULL_WAIT_S", 60.0)
    rig = make_rig(backoff=(0.05, 0.1))  # real time, the forwarder's own thread

    def full(_sent: Sent) -> None:
        raise BufferError("Local: Queue full")

    rig.producer.on_produce = full
    for mid in ("a", "b"):
        admit(rig, mid)
    rig.forwarder.start()
    try:
        wait_for(lambda: len(rig.producer.attempts) >= 3, "the forwarder to hit the full queue")
        started = time.monotonic()
        rig.forwarder.stop(timeout=5.0)
        assert time.monotonic() - started < 1.0
        assert not rig.forwarder.is_alive()
    finally:
        rig.forwarder.stop(timeout=1.0)
    assert rig.producer.sent == []
    assert committable(rig) == 0
    assert rig.ledger.total_buffered == 2


def test_the_forwarder_thread_wakes_for_an_earlier_record_at_once():
    rig = make_rig()
    admit(rig, "later", age_ms=-60_000)  # due in 65 s
    rig.forwarder.start()
    try:
        admit(rig, "now")
        wait_for(lambda: len(rig.producer.to(TARGET)) == 1, "the due record", timeout=3.0)
        assert rig.producer.to(TARGET)[0].delay_id == "now"
    finally:
        rig.forwarder.stop(timeout=2.0)
    assert not rig.forwarder.is_alive()


# -- one record's exception stays with that record -----------------------------------
def test_an_unexpected_produce_exception_dead_letters_only_that_record(rig):
    def on_produce(sent: Sent) -> None:
        if sent.topic == TARGET and sent.delay_id == "cursed":
            raise RuntimeError("boom")

    rig.producer.on_produce = on_produce
    for mid in ("a", "cursed", "b"):
        admit(rig, mid)
    rig.forwarder.try_drain()
    assert [s.delay_id for s in rig.producer.to(TARGET)] == ["a", "b"]
    (dead,) = dead_letters(rig)
    assert reason(dead) == "internal_error"
    assert dead.header("dlq-detail") == b"RuntimeError: boom"
    assert dead.header("dlq-origin-offset") == b"1"
    assert committable(rig) == 3
    assert rig.metric("delayservice_loop_errors_total", thread="forwarder") == 0


def test_an_exception_from_the_dead_letter_produce_stays_with_its_record(rig, clock):
    """Invariant 7: `send` "raises only QueueFullError", whatever one record does. When
    even the dead-letter copy cannot be produced, a stub (no key, no value) carries the
    reason and origin."""

    def on_produce(sent: Sent) -> None:
        if sent.key == b"cursed":  # the forward and the full dead letter alike
            raise RuntimeError("boom")

    rig.producer.on_produce = on_produce
    admit(rig, "a")
    admit(rig, "cursed", key=b"cursed")
    admit(rig, "b")
    rig.forwarder.try_drain()  # must not raise
    assert [s.delay_id for s in rig.producer.to(TARGET)] == ["a", "b"]
    rig.producer.deliver()
    (stub,) = rig.producer.to(DLQ)
    assert stub.key is None
    assert stub.header("dlq-stub") == b"1"
    assert stub.header("dlq-reason") == b"internal_error"
    assert stub.header("dlq-origin-offset") == b"1"
    assert committable(rig) == 3


def test_a_record_whose_stub_cannot_be_produced_either_waits_unsettled(rig, clock):
    rig.producer.on_produce = lambda sent: (_ for _ in ()).throw(RuntimeError("broken"))
    admit(rig, "a")
    rig.forwarder.try_drain()  # must not raise
    rig.producer.deliver()
    assert rig.producer.to(DLQ) == []
    assert committable(rig) == 0  # not settled: re-read after a restart, never skipped
    assert rig.metric("delayservice_loop_errors_total", thread="forwarder") >= 1


def test_a_throwing_delivery_callback_input_is_survived(rig):
    """A report whose message is unreadable is counted, not raised into poll()."""
    record = admit(rig, "a", schedule=False)
    rig.forwarder._delivered(record, None, object())  # no .timestamp()
    assert rig.metric("delayservice_loop_errors_total", thread="forwarder") == 1


def test_a_fatal_producer_error_is_reported_not_retried(rig):
    rig.producer.outcome = lambda _s: KafkaError(KafkaError._FENCED, "fenced", fatal=True)
    admit(rig, "f")
    rig.forwarder.try_drain()
    assert len(rig.fatal) == 1
    assert "fatal" in rig.fatal[0]
    assert dead_letters(rig) == []
    assert committable(rig) == 0
