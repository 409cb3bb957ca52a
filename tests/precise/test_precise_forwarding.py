"""Precise mode's forwarding on fakes: the level workers' forwarder over the wheel's
buffer, settling only what a commit point made durable.

Each step is one forwarder pass ending at a commit point (flush, failure reports
placed, inferred successes checked); the fake clock runs the backoffs and give-up
windows without sleeping. A few tests use the forwarder's own thread in real time.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from delayservice.forward import producer_rebuild
from delayservice.forward.send_errors import ForwarderFatalError
from tests.level.fakes import (
    DLQ,
    OTHER_TARGET,
    TARGET,
    FakeClock,
    Sent,
    envelope_headers,
    inferred_once,
    kafka_error,
    wait_for,
)
from tests.precise.forward_rig import PRECISE_TOPIC, PreciseRig, make_precise_rig

TIMED_OUT = KafkaError._MSG_TIMED_OUT


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def rig(clock: FakeClock) -> PreciseRig:
    return make_precise_rig(clock=clock)


def env(mid: str, **kwargs: object) -> list:
    return envelope_headers(delay_ms=10_000, message_id=mid, **kwargs)  # type: ignore[arg-type]


def fail_ids(*ids: str, code: int = TIMED_OUT, times: int = 10**9):
    """An outcome failing forwards of these ids (to their target) `times` times each."""
    left = dict.fromkeys(ids, times)

    def outcome(sent: Sent) -> KafkaError | None:
        if sent.topic != DLQ and left.get(sent.delay_id or "", 0) > 0:
            left[sent.delay_id or ""] -= 1
            return kafka_error(code, retriable=code == TIMED_OUT)
        return None

    return outcome


def reason(sent: Sent) -> str:
    return sent.header("dlq-reason").decode()


def retry_for(rig: PreciseRig, clock: FakeClock, seconds: float, step: float = 1.0) -> None:
    for _ in range(round(seconds / step)):
        clock.advance(step)
        rig.step()


# -- on time, and settled only once durable -------------------------------------------
def test_a_due_record_is_forwarded_unchanged_and_settles_only_once_a_flush_made_it_durable(rig):
    rig.producer.hold_reports = True  # the flush cannot finish: nothing is durable
    record = rig.hold("a", key=b"k1", value=b"v1", headers=env(
        "a", user=[("trace", b"t-1"), ("empty", None)]
    ))  # fmt: skip
    pinned = rig.hold("b", headers=env("b", partition=2))
    rig.step()

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
    assert first.on_delivery is None  # no callback per record on the happy path
    assert rig.wheel.settled == []

    rig.producer.hold_reports = False
    rig.step()
    assert rig.settled() == [0, 1]
    assert len(rig.producer.to(TARGET)) == 2  # sent once
    assert rig.metric("delayservice_forwarded_total") == 2
    assert rig.metric("delayservice_lateness_seconds_count") == 2


def test_a_record_is_never_sent_before_its_due_time(rig, clock):
    record = rig.hold("early", due_in_ms=5_000)
    rig.step()
    clock.advance(4.999)
    rig.step()
    assert rig.producer.attempts == []
    clock.advance(0.001)
    rig.step()
    (sent,) = rig.producer.to(TARGET)
    assert sent.at * 1000 >= record.due_ms
    assert rig.settled() == [0]


# -- retries --------------------------------------------------------------------------
def test_a_retriable_failure_is_retried_after_the_backoff_and_settles_only_on_success(rig, clock):
    rig.producer.outcome = fail_ids("r", times=2)
    rig.hold("r")
    rig.step()
    assert len(rig.producer.attempts) == 1
    assert rig.settled() == []  # a failed forward is not settled

    for backoff in (1.0, 2.0):  # exponential: 1 s, then 2 s
        clock.advance(backoff - 0.001)
        rig.step()
        before = len(rig.producer.attempts)
        assert rig.settled() == []
        clock.advance(0.001)
        rig.step()
        assert len(rig.producer.attempts) == before + 1

    assert [s.result is None for s in rig.producer.reports] == [False, False, True]
    assert rig.settled() == [0]
    assert rig.dead_letters() == []
    assert rig.metric("delayservice_forward_errors_total", error="_MSG_TIMED_OUT") == 2


def test_a_retriable_error_raised_by_produce_holds_the_record_for_a_backoff(rig, clock):
    calls = []

    def raise_twice(sent: Sent) -> None:
        calls.append(sent)
        if len(calls) <= 2:  # the send, and the slow path's look at it
            raise KafkaException(kafka_error(KafkaError._TRANSPORT, retriable=True))

    rig.producer.on_produce = raise_twice
    rig.hold("x")
    rig.step()
    assert rig.producer.sent == []
    assert rig.settled() == []
    clock.advance(1.0)
    rig.step()
    assert len(rig.producer.to(TARGET)) == 1
    assert rig.settled() == [0]


def test_metadata_that_cannot_be_fetched_is_retried_not_dead_lettered(rig, clock):
    rig.producer.metadata_error = KafkaException(kafka_error(KafkaError._TRANSPORT, retriable=True))
    rig.hold("m")
    rig.step()
    clock.advance(30.0)  # past give_up_s: an outage of metadata gives up on nothing
    rig.step()
    assert rig.producer.attempts == []
    assert rig.settled() == []
    rig.producer.metadata_error = None
    clock.advance(8.0)
    rig.step()
    assert len(rig.producer.to(TARGET)) == 1
    assert rig.settled() == [0]
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
def test_a_permanent_error_dead_letters_the_record_with_its_origin(rig, code, expected):
    rig.producer.outcome = fail_ids("p", code=code)
    rig.hold("q")
    rig.hold("p", key=b"key", value=b"value", headers=env("p", user=[("trace", b"t")]))
    rig.step()
    assert rig.settled() == [0]  # the refused one does not settle on its refusal
    rig.step()  # it goes again, as a dead letter

    (dead,) = rig.producer.to(DLQ)
    assert (dead.key, dead.value) == (b"key", b"value")
    assert reason(dead) == expected
    assert dead.header("dlq-detail")
    assert dead.header("dlq-origin-topic") == PRECISE_TOPIC.encode()
    assert dead.header("dlq-origin-partition") == b"0"
    assert dead.header("dlq-origin-offset") == b"1"
    # The record is kept whole, envelope included, so it can be replayed.
    assert dead.header("trace") == b"t"
    assert dead.header("delay-target") == TARGET.encode()
    assert dead.header("delay-id") == b"p"
    assert rig.settled() == [0, 1]
    assert rig.metric("delayservice_dead_lettered_total", reason=expected) == 1


def test_an_unknown_target_or_partition_is_dead_lettered_without_producing_to_it(rig):
    rig.hold("u", target="no-such-topic")
    rig.hold("q", headers=env("q", partition=7))  # orders has 3
    rig.step()
    assert rig.producer.to("no-such-topic") == []
    assert rig.producer.to(TARGET) == []
    assert [reason(d) for d in rig.dead_letters()] == ["unknown_topic", "unknown_partition"]
    assert rig.settled() == [0, 1]


@pytest.mark.parametrize("how", ["report", "raise"])
def test_a_dead_letter_too_large_for_its_topic_goes_as_a_stub(rig, how):
    too_large = kafka_error(KafkaError.MSG_SIZE_TOO_LARGE)
    refuse = fail_ids("big", code=KafkaError.MSG_SIZE_TOO_LARGE)
    if how == "report":

        def outcome(sent: Sent) -> KafkaError | None:
            if sent.topic == DLQ and sent.value is not None:
                return too_large
            return refuse(sent)

        rig.producer.outcome = outcome
    else:  # librdkafka refuses a message above message.max.bytes in produce() itself
        rig.producer.outcome = refuse

        def on_produce(sent: Sent) -> None:
            if sent.topic == DLQ and sent.value is not None:
                raise KafkaException(too_large)

        rig.producer.on_produce = on_produce
    value = b"x" * 5000
    rig.hold("big", key=b"kk", value=value, headers=env("big", user=[("trace", b"t")]))
    rig.step(passes=3)

    stub = rig.producer.to(DLQ)[-1]
    assert (stub.key, stub.value) == (None, None)
    assert stub.header("dlq-stub") == b"1"
    assert reason(stub) == "too_large"
    assert stub.header("delay-id") == b"big"
    assert stub.header("dlq-original-key-bytes") == b"2"
    assert stub.header("dlq-original-value-bytes") == b"5000"
    assert stub.header("dlq-origin-offset") == b"0"
    assert stub.header("trace") is None  # no payload of any kind
    assert rig.dead_letters() == [stub]
    assert rig.settled() == [0]
    assert rig.metric("delayservice_dead_letter_stubs_total") == 1
    assert rig.metric("delayservice_dead_lettered_total", reason="too_large") == 1


def test_an_intake_dead_letter_commits_its_offset_only_once_durable_and_retries(rig, clock):
    failures = {"left": 3}

    def outcome(sent: Sent) -> KafkaError | None:
        if sent.topic == DLQ and failures["left"]:
            failures["left"] -= 1
            return kafka_error(TIMED_OUT, retriable=True)
        return None

    rig.producer.outcome = outcome
    bad = rig.hold("bad", headers=[("no-envelope", b"1")], from_intake=True)
    assert bad.problem is not None
    for _ in range(3):
        rig.step()
        assert rig.committable() == 0
        clock.advance(20.0)  # past give_up_s: a dead letter is never given up on
    rig.step()
    (dead,) = rig.dead_letters()
    assert reason(dead) == "invalid_envelope"
    assert dead.header("no-envelope") == b"1"
    assert len(rig.producer.to(DLQ)) == 4
    assert rig.committable() == 1
    assert rig.wheel.settled == []  # it never was in a slot
    assert rig.metric("delayservice_dead_lettered_total", reason="retries_exhausted") == 0


def test_an_inferred_success_is_not_trusted_and_the_interval_goes_again(rig):
    """librdkafka infers success for a message when a later one on its partition is
    acknowledged; across a target deleted and re-created that message was never
    written. With failure-only reports its only trace is the `eos` debug line."""
    rig.producer.inferred = inferred_once(lambda sent: sent.delay_id == "x")
    rig.hold("x")
    rig.hold("y")
    rig.step()
    assert rig.settled() == []  # nothing settles on an interval with an inferred success
    rig.step()
    assert [s.delay_id for s in rig.producer.to(TARGET)] == ["x", "y", "x", "y"]
    assert rig.settled() == [0, 1]
    assert rig.metric("delayservice_forward_errors_total", error="unconfirmed_ack") == 2


def test_a_dead_letter_inferred_delivered_is_sent_again(rig):
    rig.producer.inferred = inferred_once(lambda sent: sent.topic == DLQ)
    rig.hold("bad", headers=[("no-envelope", b"1")], from_intake=True)
    rig.step()
    assert rig.committable() == 0
    rig.step()
    assert len(rig.producer.to(DLQ)) == 2
    assert rig.committable() == 1
    assert rig.metric("delayservice_dead_lettered_total", reason="invalid_envelope") == 1


def test_huge_target_names_are_dead_lettered_without_being_remembered(rig):
    for i in range(20):
        record = rig.hold(f"h{i}", target=f"{i}-" + "t" * 100_000, from_intake=True)
        assert record.problem is not None
        assert record.problem[0] == "invalid_target"
    assert all(len(name) <= 249 for name in rig.admission.names._memo)
    rig.step()
    assert [reason(d) for d in rig.dead_letters()] == ["invalid_target"] * 20
    assert rig.committable() == 20


# -- giving up ---------------------------------------------------------------------
def test_a_record_is_given_up_only_once_its_target_took_others_since_it_first_failed(clock):
    rig = make_precise_rig(clock=clock, backoff=(1.0, 1.0))
    rig.producer.outcome = fail_ids("stuck")
    rig.hold("stuck")
    rig.step()  # first failure at t0
    clock.advance(0.5)
    rig.hold("fine")
    rig.step()  # the same target takes another record after t0
    assert rig.settled() == [1]

    retry_for(rig, clock, 9.0)  # t0 + 9.5 s: still under give_up_s
    assert rig.dead_letters() == []
    retry_for(rig, clock, 1.0)  # t0 + 10.5 s: the next failure gives up
    rig.step()
    (dead,) = rig.dead_letters()
    assert reason(dead) == "retries_exhausted"
    assert dead.header("delay-id") == b"stuck"
    assert "accepted other records; last error: fake" in dead.header("dlq-detail").decode()
    assert rig.settled() == [1, 0]
    assert rig.metric("delayservice_dead_lettered_total", reason="retries_exhausted") == 1


def test_acks_before_the_first_failure_or_from_other_targets_do_not_give_up(clock):
    rig = make_precise_rig(clock=clock, backoff=(1.0, 1.0))
    rig.hold("before")
    rig.step()  # durable before the other record ever fails
    clock.advance(0.5)
    rig.producer.outcome = fail_ids("stuck")
    rig.hold("stuck")
    rig.step()
    clock.advance(0.5)
    rig.hold("elsewhere", target=OTHER_TARGET)
    rig.step()  # another target's success says nothing about this one

    retry_for(rig, clock, 35.0)
    assert rig.dead_letters() == []
    assert rig.settled() == [0, 2]  # "stuck" at offset 1 stays unsettled, in its slot


def test_an_outage_that_fails_every_record_dead_letters_nothing(rig, clock):
    rig.producer.outcome = fail_ids("a", "b", "c")
    for mid in ("a", "b", "c"):
        rig.hold(mid)
    rig.step()
    retry_for(rig, clock, 60.0)  # six times give_up_s, and no target took anything
    assert rig.dead_letters() == []
    assert rig.settled() == []

    rig.producer.outcome = lambda _sent: None  # the broker is back
    retry_for(rig, clock, 8.0)
    assert sorted(s.delay_id for s in rig.producer.reports if s.result is None) == ["a", "b", "c"]
    assert sorted(rig.settled()) == [0, 1, 2]
    assert rig.metric("delayservice_dead_lettered_total", reason="retries_exhausted") == 0


# -- a full queue and stopping ---------------------------------------------------------
def test_a_full_queue_is_waited_out_and_records_leave_in_due_order(rig, clock):
    left = {"full": 3}

    def on_produce(_sent: Sent) -> None:
        if left["full"]:
            left["full"] -= 1
            raise BufferError("Local: Queue full")

    rig.producer.on_produce = on_produce
    for i, mid in enumerate(("a", "b", "c")):
        rig.hold(mid, due_in_ms=-10 + i)  # due in a, b, c order
    start = clock.time()
    rig.step()
    assert clock.time() > start  # the queue was served while it was full
    assert [s.delay_id for s in rig.producer.to(TARGET)] == ["a", "b", "c"]
    assert rig.settled() == [0, 1, 2]


def test_a_stop_ends_a_wait_for_a_full_queue_at_once_leaving_records_unsettled():
    rig = make_precise_rig(backoff=(0.05, 0.1))  # real time, the forwarder's own thread

    def full(_sent: Sent) -> None:
        raise BufferError("Local: Queue full")

    rig.producer.on_produce = full
    for mid in ("a", "b"):
        rig.hold(mid)
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
    assert rig.wheel.settled == []
    assert len(rig.buffer) == 2  # still held, and in their slot files for the restart


def test_the_forwarder_thread_wakes_for_an_earlier_record_at_once():
    rig = make_precise_rig()
    rig.hold("later", due_in_ms=60_000)
    rig.forwarder.start()
    try:
        rig.hold("now")
        wait_for(lambda: len(rig.producer.to(TARGET)) == 1, "the due record", timeout=3.0)
        assert rig.producer.to(TARGET)[0].delay_id == "now"
        wait_for(lambda: rig.wheel.settled == [(0, 1)], "its commit point", timeout=3.0)
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
        rig.hold(mid)
    rig.step()
    assert [s.delay_id for s in rig.producer.to(TARGET)] == ["a", "b"]
    (dead,) = rig.dead_letters()
    assert reason(dead) == "internal_error"
    assert dead.header("dlq-detail") == b"RuntimeError: boom"
    assert dead.header("dlq-origin-offset") == b"1"
    assert sorted(rig.settled()) == [0, 1, 2]
    assert rig.metric("delayservice_loop_errors_total", thread="forwarder") == 0


def test_an_exception_from_the_dead_letter_produce_stays_with_its_record(rig):
    def on_produce(sent: Sent) -> None:
        if sent.key == b"cursed":  # the forward and the full dead letter alike
            raise RuntimeError("boom")

    rig.producer.on_produce = on_produce
    rig.hold("a")
    rig.hold("cursed", key=b"cursed")
    rig.hold("b")
    rig.step()  # must not raise
    assert [s.delay_id for s in rig.producer.to(TARGET)] == ["a", "b"]
    (stub,) = rig.producer.to(DLQ)
    assert stub.key is None
    assert stub.header("dlq-stub") == b"1"
    assert stub.header("dlq-reason") == b"internal_error"
    assert stub.header("dlq-origin-offset") == b"1"
    assert sorted(rig.settled()) == [0, 1, 2]


def test_a_record_whose_stub_cannot_be_produced_either_waits_unsettled(rig):
    rig.producer.on_produce = lambda sent: (_ for _ in ()).throw(RuntimeError("broken"))
    rig.hold("a")
    rig.step()  # must not raise
    assert rig.producer.to(DLQ) == []
    assert rig.settled() == []  # stays in its slot: sent again, never skipped
    assert len(rig.buffer) == 1
    assert rig.metric("delayservice_loop_errors_total", thread="forwarder") >= 1


def test_a_fatal_producer_error_replaces_the_producer_and_nothing_settles_on_it(rig):
    rig.producer.fatal_after = 1  # the forward is queued, then purged by a fatal error
    rig.hold("f")
    rig.step()
    assert rig.settled() == []
    assert len(rig.producers) == 2  # the interval goes again through a new producer
    rig.step()
    assert [s.delay_id for s in rig.producer.to(TARGET)] == ["f"]
    assert rig.settled() == [0]
    assert rig.fatal == []
    assert rig.dead_letters() == []


def test_a_producer_that_keeps_failing_for_good_stops_the_daemon_with_nothing_settled(rig):
    """Each new producer goes fatal too: after the replacements allowed, the thread
    reports it fatal (the daemon stops) instead of replacing producers forever."""
    rig.producer.fatal_after = 1
    rig.hold("f")

    def every_producer_goes_fatal() -> None:
        made = 1
        for _ in range(20):
            rig.step()
            if len(rig.producers) > made:
                made = len(rig.producers)
                rig.producer.fatal_after = 1

    with pytest.raises(ForwarderFatalError, match="fake fatal"):
        every_producer_goes_fatal()
    assert rig.settled() == []
    assert len(rig.producers) == 1 + producer_rebuild.REBUILDS
