"""The forwarder's commit path on fakes, under both guarantees.

Refusals arrive only as error reports (or as an abortable transaction): a record that
failed is sent again from it on, after a backoff, or dead-lettered; what was made
durable commits, and in exactly-once a read_committed reader sees each record once.
"""

from __future__ import annotations

import logging
import threading

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaError, KafkaException

from delayservice.forward import checkpoint, handovers
from delayservice.forward import forwarder as forwarder_module
from delayservice.forward import transaction as transaction_module
from tests.level import fakes
from tests.level.fakes import (
    DLQ,
    LEVEL,
    TARGET,
    FakeClock,
    LevelRig,
    Sent,
    envelope_headers,
    first_topic,
    inferred_once,
    kafka_error,
    make_level_rig,
)
from tests.level.test_consumer_loop import (
    DELAY,
    append,
    dead,
    forward,
    forwarded,
    step,
    subscribed,
)

GUARANTEES = [False, True]


def rig_for(clock: FakeClock, exactly_once: bool, **kwargs: object) -> LevelRig:
    return subscribed(make_level_rig(clock=clock, exactly_once=exactly_once, **kwargs))  # type: ignore[arg-type]


def committed(rig: LevelRig) -> dict[int, int]:
    """Offsets committed for the level: by the consumer, or inside transactions."""
    if rig.forwarder.transactional:
        out: dict[int, int] = {}
        for _sent, offsets in rig.producer.committed_txns:
            out.update({tp[1]: offset for tp, offset in offsets if tp[0] == LEVEL.topic})
        return out
    return dict(rig.consumer.committed_offsets)


def run(rig: LevelRig, clock: FakeClock, seconds: float = 0.0, passes: int = 3) -> None:
    """Let time pass, then read, forward and commit a few times."""
    clock.advance(seconds)
    for _ in range(passes):
        step(rig)
        forward(rig, commit=True)
        step(rig)
        step(rig)


def fail_ids(*failing: str, code: int = KafkaError._MSG_TIMED_OUT, times: int = 1):
    """An outcome that refuses the records with these ids, `times` times each."""
    left = dict.fromkeys(failing, times)

    def outcome(sent: Sent) -> KafkaError | None:
        if sent.topic == TARGET and left.get(sent.delay_id or "", 0) > 0:
            left[sent.delay_id or ""] -= 1
            return kafka_error(code, retriable=code == KafkaError._MSG_TIMED_OUT)
        return None

    return outcome


def duplicates(rig: LevelRig) -> int:
    seen = forwarded(rig)
    return len(seen) - len(set(seen))


# -- an error report in the middle of an interval -------------------------------------
@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_an_error_report_mid_interval_sends_its_partition_again_from_the_record(
    clock, exactly_once
):
    rig = rig_for(clock, exactly_once, backoff=(1.0, 8.0))
    rig.consumer.queue_rebalance("assign", 0, 1)
    rig.producer.outcome = fail_ids("id-0-1", times=2)
    append(rig, 0, 3)
    append(rig, 1, 2)
    # The records' contents are alike: the second pass names the record (and, in
    # exactly-once, the third sends the other partition without it).
    run(rig, clock, passes=3 if exactly_once else 2)
    # Held back for the backoff; its partition commits stop below it.
    assert committed(rig) == ({1: 2} if exactly_once else {0: 1, 1: 2})
    assert rig.metric("delayservice_forward_errors_total", error="_MSG_TIMED_OUT") == 1
    run(rig, clock, 0.5)
    assert "id-0-1" not in forwarded(rig)  # still within the backoff
    run(rig, clock, 0.6)
    assert sorted(set(forwarded(rig))) == ["id-0-0", "id-0-1", "id-0-2", "id-1-0", "id-1-1"]
    assert committed(rig) == {0: 3, 1: 2}
    assert dead(rig) == {}
    if exactly_once:
        assert duplicates(rig) == 0  # the aborted attempts are invisible to read_committed
        assert rig.producer.aborted
        # The partition waited for the record: its order holds.
        assert [i for i in forwarded(rig) if i.startswith("id-0-")] == [
            "id-0-0",
            "id-0-1",
            "id-0-2",
        ]


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_record_the_broker_did_not_stamp_goes_again_with_the_same_due_time(clock, exactly_once):
    """A level topic switched to CreateTime: its records are due a level after they
    were read, a time kept beside them. Sent again after a refusal (set aside, or its
    transaction aborted), a forward must say the same due time, not 1970, and must not
    count 56 years late."""
    rig = rig_for(clock, exactly_once, backoff=(1.0, 8.0))
    rig.consumer.queue_rebalance("assign", 0)
    rig.producer.outcome = fail_ids("id-0-0")
    append(rig, 0, timestamp_ms=clock.ms() - 3_600_000, timestamp_type=TIMESTAMP_CREATE_TIME)
    read_ms = clock.ms()
    step(rig)
    forward(rig)  # read and admitted: due a level from now
    run(rig, clock, DELAY / 1000, passes=2)
    assert rig.metric("delayservice_forward_errors_total", error="_MSG_TIMED_OUT") == 1
    run(rig, clock, 1.1)
    attempts = [s for s in rig.producer.attempts if s.topic == TARGET]
    assert len(attempts) == 2
    assert {s.header("delay-due-ms") for s in attempts} == {str(read_ms + DELAY).encode()}
    assert forwarded(rig) == ["id-0-0"]
    assert committed(rig) == {0: 1}
    assert not rig.group.overrides.get(0)  # its due time was forgotten once committed
    late_s = rig.metric("delayservice_lateness_seconds_sum", level=LEVEL.name)
    assert late_s < 60, f"counted {late_s:.0f} s late"


def test_a_record_set_aside_for_a_backoff_shows_as_held_and_overdue(clock):
    """At-least-once: a refused record waits out its backoff apart from its partition's
    queue; the gauges still say it is held, and how overdue, until it is sent."""
    rig = rig_for(clock, False, backoff=(1.0, 8.0))
    rig.consumer.queue_rebalance("assign", 0)
    rig.producer.outcome = fail_ids("id-0-0")
    due_ms = clock.ms()
    append(rig, 0, age_ms=DELAY)  # due now
    run(rig, clock, passes=2)
    assert rig.forwarder.inbox.set_aside_due_ms == due_ms
    run(rig, clock, 0.5)  # within the backoff: nothing else is held
    assert rig.group.earliest_held_ms() is None
    labels = {"level": LEVEL.name}
    assert rig.metric("delayservice_next_due_timestamp_seconds", **labels) == due_ms / 1000
    assert rig.metric("delayservice_oldest_overdue_seconds", **labels) == pytest.approx(0.5)
    run(rig, clock, 0.6)
    assert forwarded(rig) == ["id-0-0"]
    assert rig.metric("delayservice_next_due_timestamp_seconds", **labels) == 0


@pytest.mark.parametrize("exactly_once", GUARANTEES)
@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (KafkaError.MSG_SIZE_TOO_LARGE, "too_large"),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, "not_authorized"),
        (KafkaError.UNKNOWN_TOPIC_OR_PART, "unknown_topic"),
        (KafkaError.POLICY_VIOLATION, "rejected"),
    ],
)
def test_a_permanent_refusal_dead_letters_the_record_with_its_origin(
    clock, exactly_once, code, reason
):
    rig = rig_for(clock, exactly_once)
    rig.consumer.queue_rebalance("assign", 0)
    rig.producer.outcome = fail_ids("id-0-1", code=code, times=99)
    append(rig, 0, 3, key=b"k")
    run(rig, clock)
    assert dead(rig) == {1: reason}
    (letter,) = rig.producer.visible(DLQ)
    assert letter.header("dlq-origin-topic") == LEVEL.topic.encode()
    assert letter.header("dlq-origin-partition") == b"0"
    assert letter.header("delay-id") == b"id-0-1"
    assert letter.value == b"v"
    assert sorted(set(forwarded(rig))) == ["id-0-0", "id-0-2"]
    assert committed(rig) == {0: 3}
    assert rig.metric("delayservice_dead_lettered_total", reason=reason) == 1
    if exactly_once:
        assert duplicates(rig) == 0


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_dead_letter_too_large_for_its_topic_goes_as_a_stub(clock, exactly_once):
    rig = rig_for(clock, exactly_once)
    rig.consumer.queue_rebalance("assign", 0)

    def outcome(sent: Sent) -> KafkaError | None:
        if sent.value == b"x" * 5000:  # too large for its target and for the DLQ
            return kafka_error(KafkaError.MSG_SIZE_TOO_LARGE)
        return None

    rig.producer.outcome = outcome
    append(rig, 0, value=b"x" * 5000)
    append(rig, 0)
    run(rig, clock, passes=4)
    (stub,) = rig.producer.visible(DLQ)
    assert stub.value is None
    assert stub.header("dlq-stub") == b"1"
    assert stub.header("dlq-reason") == b"too_large"
    assert stub.header("dlq-original-value-bytes") == b"5000"
    assert forwarded(rig) == ["id-0-1"]
    assert committed(rig) == {0: 2}
    assert rig.metric("delayservice_dead_letter_stubs_total") == 1


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_failing_dead_letter_topic_keeps_the_record_uncommitted_and_retries(clock, exactly_once):
    rig = rig_for(clock, exactly_once)
    rig.consumer.queue_rebalance("assign", 0)
    down = [True]

    def outcome(sent: Sent) -> KafkaError | None:
        if sent.topic == DLQ and down[0]:
            return kafka_error(KafkaError.NOT_ENOUGH_REPLICAS, retriable=True)
        return None

    rig.producer.outcome = outcome
    append(rig, 0, headers=[("no", b"envelope")])
    append(rig, 0)
    run(rig, clock, passes=2)
    assert committed(rig).get(0, 0) == 0
    assert dead(rig) == {}
    down[0] = False
    run(rig, clock, 10.0)
    assert dead(rig) == {0: "invalid_envelope"}
    assert committed(rig) == {0: 2}


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_an_outage_that_refuses_everything_dead_letters_nothing_and_loses_nothing(
    clock, exactly_once
):
    rig = rig_for(clock, exactly_once, give_up_s=60.0, backoff=(1.0, 8.0))
    rig.consumer.queue_rebalance("assign", 0, 1)
    outage = [True]
    rig.producer.outcome = lambda sent: (
        kafka_error(KafkaError._MSG_TIMED_OUT, retriable=True) if outage[0] else None
    )
    append(rig, 0, 3)
    append(rig, 1, 3)
    for _ in range(40):  # ten minutes of refusals, far past give_up_s
        run(rig, clock, 15.0, passes=1)
    assert dead(rig) == {}
    assert all(offset == 0 for offset in committed(rig).values())
    assert rig.metric("delayservice_dead_lettered_total", reason="retries_exhausted") == 0
    outage[0] = False
    run(rig, clock, 10.0)
    assert sorted(set(forwarded(rig))) == sorted(f"id-{p}-{o}" for p in (0, 1) for o in range(3))
    assert committed(rig) == {0: 3, 1: 3}
    if exactly_once:
        assert duplicates(rig) == 0


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_record_failing_while_its_target_accepts_others_is_given_up(clock, exactly_once):
    rig = rig_for(clock, exactly_once, give_up_s=60.0, backoff=(1.0, 8.0))
    rig.consumer.queue_rebalance("assign", 0, 1)
    rig.producer.outcome = fail_ids("id-0-0", times=10_000)
    append(rig, 0, 2)
    for _ in range(12):
        append(rig, 1)  # the target keeps accepting other records
        run(rig, clock, 9.0, passes=3)
    assert dead(rig) == {0: "retries_exhausted"}
    run(rig, clock, 9.0)
    assert "id-0-1" in forwarded(rig)
    assert committed(rig)[0] == 2
    assert "failing for" in rig.producer.visible(DLQ)[0].header("dlq-detail").decode()


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_report_that_matches_nothing_sent_sends_the_interval_again(clock, exactly_once):
    rig = rig_for(clock, exactly_once)
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 2)
    step(rig)
    forward(rig)
    from tests.level.fakes import message

    stray = message(0, 99, 0, key=b"other", value=b"other", topic=TARGET)
    rig.forwarder.on_report(kafka_error(KafkaError._MSG_TIMED_OUT, retriable=True), stray)
    forward(rig, commit=True)
    assert committed(rig) == {}
    run(rig, clock, 2.0)
    assert committed(rig) == {0: 2}
    assert sorted(set(forwarded(rig))) == ["id-0-0", "id-0-1"]
    if exactly_once:
        assert duplicates(rig) == 0


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_success_librdkafka_only_inferred_sends_the_interval_again(clock, exactly_once):
    """librdkafka counts a record delivered when a later one on its partition is
    acknowledged; across a target deleted and re-created that record was never written.
    Only failures are reported, so the trace is its `eos` debug line: nothing of that
    interval may commit, and all of it goes again."""
    rig = rig_for(clock, exactly_once)
    rig.consumer.queue_rebalance("assign", 0, 1)
    rig.producer.inferred = inferred_once(lambda sent: sent.delay_id == "id-0-1")
    append(rig, 0, 3)
    append(rig, 1, 2)
    step(rig)
    forward(rig, commit=True)
    assert committed(rig) == {}  # the interval with the inferred success commits nothing
    assert "id-0-1" not in forwarded(rig)
    run(rig, clock, 1.0)
    assert sorted(set(forwarded(rig))) == ["id-0-0", "id-0-1", "id-0-2", "id-1-0", "id-1-1"]
    assert committed(rig) == {0: 3, 1: 2}
    assert rig.metric("delayservice_forward_errors_total", error="unconfirmed_ack") == 5
    if exactly_once:
        assert duplicates(rig) == 0
        assert rig.producer.aborted


def test_metadata_that_cannot_be_fetched_holds_the_partition_instead_of_dead_lettering(clock):
    rig = rig_for(clock, False, topics={DLQ: 1})  # the target is not cached: must be asked
    rig.producer.metadata_error = KafkaException(kafka_error(KafkaError._TRANSPORT, retriable=True))
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 2)
    run(rig, clock)
    assert dead(rig) == {}
    assert rig.producer.sent == []
    assert committed(rig) == {}
    rig.producer.metadata_error = None
    rig.producer.topics[TARGET] = 3
    run(rig, clock, 5.0)
    assert forwarded(rig) == ["id-0-0", "id-0-1"]
    assert committed(rig) == {0: 2}


# -- transactions ----------------------------------------------------------------------
def test_exactly_once_commits_offsets_inside_the_transaction_never_through_the_consumer(clock):
    rig = rig_for(clock, True)
    rig.consumer.queue_rebalance("assign", 0, 1)
    append(rig, 0, 2)
    append(rig, 1, 1)
    run(rig, clock)
    ((sent, offsets),) = rig.producer.committed_txns
    assert sorted(first_topic(offsets)) == [(0, 2), (1, 1)]
    assert sorted(s.delay_id or "" for s in sent) == ["id-0-0", "id-0-1", "id-1-0"]
    assert rig.consumer.commits == []
    assert rig.producer.txn_inits == 1
    assert rig.metric("delayservice_forwarded_total") == 3


def test_a_revoke_mid_transaction_commits_it_before_the_partition_goes(clock):
    rig = rig_for(clock, True)
    rig.consumer.queue_rebalance("assign", 0, 1)
    append(rig, 0, 2)
    append(rig, 0, age_ms=0)  # not yet due: dropped with the partition
    append(rig, 1, 1)
    step(rig)
    forward(rig)
    assert rig.producer.txn_open
    rig.consumer.queue_rebalance("revoke", 0)
    step(rig)
    ((_sent, offsets),) = rig.producer.committed_txns
    assert sorted(first_topic(offsets)) == [(0, 2), (1, 1)]
    assert rig.loop.owned() == [1]
    assert rig.group.total_buffered == 0
    assert rig.consumer.commits == []


def test_a_loss_mid_transaction_aborts_it_and_sends_the_others_again(clock):
    rig = rig_for(clock, True)
    rig.consumer.queue_rebalance("assign", 0, 1)
    append(rig, 0, 2)
    append(rig, 1, 1)
    step(rig)
    forward(rig)
    rig.consumer.queue_rebalance("lost", 0)
    step(rig)
    assert rig.producer.committed_txns == []
    assert len(rig.producer.aborted) == 3
    run(rig, clock)
    assert forwarded(rig) == ["id-1-0"]
    assert committed(rig) == {1: 1}


def read_on_partition_0(clock: FakeClock, exactly_once: bool, count: int) -> LevelRig:
    """A rig that owns partition 0 and has read `count` records of it."""
    rig = rig_for(clock, exactly_once)
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, count)
    step(rig)
    return rig


def test_a_flush_timeout_aborts_and_the_transaction_goes_again(clock):
    rig = read_on_partition_0(clock, True, 2)
    rig.producer.hold_reports = True
    forward(rig, commit=True)
    assert rig.producer.committed_txns == []
    assert rig.metric("delayservice_commit_failures_total") == 1
    rig.producer.hold_reports = False
    run(rig, clock)
    assert forwarded(rig) == ["id-0-0", "id-0-1"]
    assert committed(rig) == {0: 2}


def test_a_fenced_producer_stops_the_daemon_and_commits_nothing(clock):
    rig = rig_for(clock, True)
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 2)
    rig.producer.commit_txn_raises = KafkaException(
        KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True)
    )
    step(rig)
    with pytest.raises(forwarder_module.ForwarderFatalError):
        forward(rig, commit=True)
    assert rig.producer.committed_txns == []
    assert forwarded(rig) == []


def test_a_fenced_producer_on_its_thread_reports_fatal_once():
    rig = make_level_rig(exactly_once=True, commit_interval_s=0.02)
    rig.producer.commit_txn_raises = KafkaException(
        KafkaError(KafkaError.PRODUCER_FENCED, "fenced", fatal=True)
    )
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 2)
    rig.forwarder.start()
    rig.loop.start()
    try:
        from tests.level.fakes import wait_for

        wait_for(lambda: rig.fatal != [], "the fatal report")
    finally:
        rig.loop.request_stop()
        rig.loop.join(5.0)
    assert "instance_name" in rig.fatal[0]
    assert forwarded(rig) == []


def test_an_exactly_once_forwarder_fences_its_predecessor_before_any_record_comes():
    """A killed predecessor's open transaction holds its pending offset commit, and a
    read_committed consumer's offset fetch waits on it: init_transactions (which aborts
    it) must not wait for a record to send, or none would come until it timed out."""
    from tests.level.fakes import wait_for

    rig = make_level_rig(exactly_once=True, commit_interval_s=0.02)
    rig.forwarder.start()
    try:
        wait_for(lambda: rig.producer.txn_inits == 1, "init_transactions with no record")
    finally:
        rig.forwarder.stop(5.0)
    assert rig.producer.sent == []
    assert rig.fatal == []


def test_a_retriable_failure_sending_offsets_aborts_and_goes_again(clock):
    rig = rig_for(clock, True)
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 2)
    rig.producer.send_offsets_raises = KafkaException(
        KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE, "moving", retriable=True)
    )
    run(rig, clock, passes=1)
    assert rig.producer.committed_txns == []
    rig.producer.send_offsets_raises = None
    run(rig, clock, 1.0)
    assert forwarded(rig) == ["id-0-0", "id-0-1"]
    assert committed(rig) == {0: 2}


def test_a_send_offsets_call_that_hangs_past_its_timeout_is_fatal(clock, monkeypatch):
    monkeypatch.setattr(transaction_module, "SEND_OFFSETS_TIMEOUT_S", 0.05)
    monkeypatch.setattr(transaction_module, "GUARD_SLACK_S", 0.05)
    rig = rig_for(clock, True)
    release = threading.Event()
    rig.producer.send_offsets_to_transaction = lambda *a, **k: release.wait(5)  # type: ignore[method-assign]
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 1)
    step(rig)
    try:
        with pytest.raises(forwarder_module.ForwarderFatalError, match="did not return"):
            forward(rig, commit=True)
    finally:
        release.set()
    assert forwarded(rig) == []


def test_nothing_is_produced_while_a_transaction_commits(clock):
    """One thread owns the transactional producer: a produce during the commit would be
    refused by librdkafka; the fake records any that happens."""
    rig = rig_for(clock, True)
    during: list[str] = []
    commit = rig.producer.commit_transaction

    def committing(timeout: float = -1) -> None:
        rig.producer.on_produce = lambda sent: during.append(sent.delay_id or "")
        try:
            commit(timeout)
        finally:
            rig.producer.on_produce = None

    rig.producer.commit_transaction = committing  # type: ignore[method-assign]
    rig.consumer.queue_rebalance("assign", 0)
    for _ in range(5):
        append(rig, 0, 3)
        run(rig, clock, 0.2, passes=1)
    assert during == []
    assert len(forwarded(rig)) == 15


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_stop_mid_interval_makes_what_was_sent_durable(exactly_once):
    rig = make_level_rig(exactly_once=exactly_once, commit_interval_s=30.0)
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 4)
    rig.forwarder.start()
    rig.loop.start()
    from tests.level.fakes import wait_for

    wait_for(lambda: len(rig.producer.sent) == 4, "the records to be sent")
    rig.loop.request_stop()
    assert rig.loop.join(5.0)
    assert forwarded(rig) == ["id-0-0", "id-0-1", "id-0-2", "id-0-3"]
    if exactly_once:
        assert rig.producer.committed_txns[-1][1] == [((LEVEL.topic, 0), 4)]
    else:
        assert rig.consumer.committed_offsets == {0: 4}


def test_the_precise_topic_copy_and_the_level_copy_keep_the_user_headers(clock):
    rig = rig_for(clock, False)
    rig.consumer.queue_rebalance("assign", 0)
    append(
        rig,
        0,
        age_ms=0,
        headers=envelope_headers(message_id="long", delay_ms=15_000, user=[("trace", b"t1")]),
    )
    run(rig, clock, LEVEL.delay_ms / 1000)
    (copy,) = rig.producer.to("delay_topic_3")
    assert copy.header("trace") == b"t1"
    assert copy.header("delay-target") == TARGET.encode()


def test_transactions_that_cannot_start_yet_leave_the_records_in_the_buffer(clock):
    rig = rig_for(clock, True)
    attempts = []

    def not_yet(timeout: float = -1) -> None:
        attempts.append(timeout)
        if len(attempts) == 1:
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, "coordinator loading", retriable=True)
            )

    rig.producer.init_transactions = not_yet  # type: ignore[method-assign]
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 2)
    step(rig)
    with pytest.raises(forwarder_module.SendLaterError):
        forward(rig)
    assert rig.group.counts[(LEVEL.topic, 0)] == 2
    rig.producer.txn_inits = 1
    run(rig, clock)
    assert forwarded(rig) == ["id-0-0", "id-0-1"]
    assert committed(rig) == {0: 2}


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_producer_that_failed_for_good_is_replaced_and_the_interval_goes_again(
    clock, exactly_once
):
    """After a broker restart librdkafka can refuse to end a transaction (invalid state,
    fatal): a new producer takes over, its init_transactions ends the old transaction,
    and what was not committed is sent again through it."""
    from tests.level.fakes import FakeProducer

    rig = rig_for(clock, exactly_once)
    second = FakeProducer(dict(rig.producer.topics), clock, rig.producer.config)
    second.owner = rig.consumer
    fakes.PRODUCERS.append(second)
    rig.forwarder.rebuild.make = lambda: second
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 2)
    run(rig, clock)
    append(rig, 0, 2)
    if exactly_once:  # the transaction API raises it, flagged fatal
        rig.producer.commit_txn_raises = KafkaException(
            KafkaError(KafkaError.INVALID_TXN_STATE, "invalid state", fatal=True)
        )
    else:  # an idempotence failure: the queue is purged, produce() refused with _FATAL
        rig.producer.fatal_after = 1
    run(rig, clock, passes=1)
    assert rig.forwarder.rebuild.producer is second
    run(rig, clock)
    assert rig.fatal == []
    seen = forwarded(rig) + [s.delay_id or "" for s in second.visible(TARGET)]
    assert sorted(set(seen)) == [f"id-0-{o}" for o in range(4)]
    if exactly_once:
        assert len(seen) == 4  # no duplicate for read_committed
        assert second.committed_txns[-1][1] == [((LEVEL.topic, 0), 4)]
    else:
        assert rig.consumer.committed_offsets == {0: 4}


def test_a_revoke_while_the_group_metadata_is_unavailable_still_hands_the_partition_over(
    clock,
):
    rig = rig_for(clock, True)
    rig.consumer.queue_rebalance("assign", 0, 1)
    append(rig, 0, 2)
    step(rig)
    forward(rig)

    def unavailable() -> None:
        raise RuntimeError("Consumer group metadata not available")

    rig.consumer.consumer_group_metadata = unavailable  # type: ignore[method-assign]
    rig.consumer.queue_rebalance("revoke", 0)
    step(rig)
    assert rig.loop.owned() == [1]
    assert rig.metric("delayservice_loop_errors_total", thread="consumer") == 0
    # The metadata kept is of the generation before the revoke: the coordinator refuses
    # its offsets, so the records go uncommitted and unseen, for the next owner.
    assert committed(rig) == {}
    assert rig.producer.visible(TARGET) == []


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_at_a_steady_rate_a_caught_up_forwarder_commits_after_the_floor_not_the_interval(
    clock, exactly_once
):
    """Some record is always about to fall due at a steady rate, so waiting to be idle
    would commit only at the interval, and a read_committed reader would wait for it."""
    rig = rig_for(clock, exactly_once, commit_interval_s=1.0)
    rig.consumer.queue_rebalance("assign", 0)
    floor = checkpoint.commit_floor(1.0)
    for tick in range(16):  # a record due every 50 ms, each sent when due
        append(rig, 0, age_ms=LEVEL.delay_ms - 50 * tick)
    step(rig)
    commits_at = []
    for tick in range(16):  # 0.8 s: less than the interval
        forward(rig)
        if len(committed(rig)) and (not commits_at or committed(rig)[0] != commits_at[-1][1]):
            commits_at.append((tick, committed(rig)[0]))
        step(rig)
        step(rig)
        clock.advance(0.05)
    assert commits_at, "nothing committed within the interval"
    first_tick = commits_at[0][0]
    assert first_tick * 0.05 <= floor + 0.05  # once caught up, after the floor
    assert len(commits_at) >= 2  # and again after the next floor, before the interval ends


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_commit_point_reports_the_time_each_of_its_steps_took(clock, exactly_once):
    """What a commit point waits for, step by step (`delayservice_commit_step_seconds`):
    the flush under both guarantees, the offsets and the commit under exactly-once."""
    rig = rig_for(clock, exactly_once)
    takes = {"flush": 0.004, "send_offsets_to_transaction": 0.009, "commit_transaction": 0.002}
    for call, seconds in takes.items():
        original = getattr(rig.producer, call)

        def slowed(*args: object, _call=original, _seconds=seconds, **kwargs: object) -> object:
            clock.advance(_seconds)
            return _call(*args, **kwargs)

        setattr(rig.producer, call, slowed)
    rig.consumer.queue_rebalance("assign", 0, 1)
    for _ in range(3):
        append(rig, 0, 2)
        append(rig, 1, 1)
        run(rig, clock, 0.2, passes=1)
    assert len(forwarded(rig)) == 9

    def observed(step_name: str) -> tuple[float, float]:
        count = rig.metric("delayservice_commit_step_seconds_count", step=step_name)
        total = rig.metric("delayservice_commit_step_seconds_sum", step=step_name)
        return count, total

    flushes, flushed_for = observed("flush")
    assert flushes >= 3
    assert flushed_for == pytest.approx(0.004 * flushes)
    offsets, offsets_for = observed("send_offsets")
    commits, committed_for = observed("commit_transaction")
    if exactly_once:
        assert commits == len(rig.producer.committed_txns) >= 3
        # librdkafka's commit flushes what is left: the fake's flush is timed in it too
        assert committed_for == pytest.approx((0.002 + 0.004) * commits)
        assert offsets == commits
        assert offsets_for == pytest.approx(0.009 * offsets)
    else:
        assert (offsets, commits) == (0, 0)


def lose_the_next_flush_error(rig: LevelRig) -> None:
    """The next flush fails as confluent-kafka's does when a producer is fenced while it
    serves the callbacks: a `SystemError` and no exception set."""
    real_flush = rig.producer.flush
    failures = [
        SystemError(
            "<method 'flush' of 'cimpl.Producer' objects> returned NULL without setting "
            "an exception"
        )
    ]

    def flush(timeout: float = -1) -> int:
        if failures:
            raise failures.pop()
        return real_flush(timeout)

    rig.producer.flush = flush  # type: ignore[method-assign]


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_flush_that_lost_its_error_is_tried_again_not_an_unexpected_error(
    clock, exactly_once: bool
):
    """confluent-kafka's flush can fail without an exception when a producer is fenced
    while it serves the callbacks (a `SystemError`); the next call raises the cause."""
    rig = read_on_partition_0(clock, exactly_once, 2)
    lose_the_next_flush_error(rig)
    with pytest.raises(forwarder_module.SendLaterError):
        forward(rig, commit=True)
    assert rig.metric("delayservice_loop_errors_total", thread="forwarder") == 1
    run(rig, clock)
    assert forwarded(rig) == ["id-0-0", "id-0-1"]
    assert committed(rig) == {0: 2}


def test_a_handover_whose_flush_lost_its_error_is_a_counted_warning_and_sends_again(clock, caplog):
    """The same lost error at a revoke's commit point (called outside `step`): the
    transaction is aborted, the partition handed over uncommitted, the other's records
    go again; a WARNING without a trace, counted among the loop's errors."""
    rig = rig_for(clock, True)
    rig.consumer.queue_rebalance("assign", 0, 1)
    append(rig, 0, 2)
    append(rig, 1, 1)
    step(rig)
    forward(rig)
    lose_the_next_flush_error(rig)
    rig.consumer.queue_rebalance("revoke", 0)
    with caplog.at_level(logging.WARNING, logger=handovers.__name__):
        step(rig)
    handing = [r for r in caplog.records if "handing over" in r.getMessage()]
    assert [(r.levelno, r.exc_info) for r in handing] == [(logging.WARNING, None)]
    assert "lost its error" in handing[0].getMessage()
    assert rig.metric("delayservice_loop_errors_total", thread="forwarder") == 1
    assert rig.loop.owned() == [1]
    run(rig, clock)
    assert forwarded(rig) == ["id-1-0"]
    assert committed(rig) == {1: 1}


@pytest.mark.parametrize("bare", [False, True])
def test_a_flush_that_raises_a_bare_fatal_kafka_error_is_taken_as_the_fence_it_is(
    clock, bare: bool
):
    """The same fence raised as confluent-kafka should (a `KafkaException`) and as it
    did beside CPU hogs (the `KafkaError` itself): the same outcome."""
    rig = read_on_partition_0(clock, True, 2)
    real_flush = rig.producer.flush
    error = KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True)
    raised: list[bool] = []

    def flush(timeout: float = -1) -> int:
        if not raised:
            raised.append(True)
            if bare:
                fakes.raise_bare_kafka_error(error)
            raise KafkaException(error)
        return real_flush(timeout)

    rig.producer.flush = flush  # type: ignore[method-assign]
    with pytest.raises(forwarder_module.ForwarderFatalError, match="fenced"):
        forward(rig, commit=True)
    assert raised == [True]
    assert rig.producer.committed_txns == []


def test_a_bare_kafka_error_never_ends_the_forwarders_thread():
    """Raised on the forwarder's own thread, not fatal: counted, survived, and what
    was due goes out once the next flush works."""
    from tests.level.fakes import wait_for

    rig = make_level_rig(exactly_once=True, commit_interval_s=0.02)
    real_flush = rig.producer.flush
    raised: list[bool] = []

    def flush(timeout: float = -1) -> int:
        if not raised:
            raised.append(True)
            fakes.raise_bare_kafka_error(KafkaError(KafkaError._TRANSPORT, "broker away"))
        return real_flush(timeout)

    rig.producer.flush = flush  # type: ignore[method-assign]
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 2)
    rig.forwarder.start()
    rig.loop.start()
    try:
        wait_for(lambda: committed(rig) == {0: 2}, "the records committed after the error")
        assert rig.forwarder.is_alive()
    finally:
        rig.loop.request_stop()
        rig.loop.join(5.0)
        rig.forwarder.stop(5.0)
    assert raised == [True]
    assert rig.metric("delayservice_loop_errors_total", thread="forwarder") == 1
    assert forwarded(rig) == ["id-0-0", "id-0-1"]
    assert rig.fatal == []


def test_any_other_system_error_stays_unexpected(clock):
    rig = read_on_partition_0(clock, True, 1)

    def flush(timeout: float = -1) -> int:
        raise SystemError("something else")

    rig.producer.flush = flush  # type: ignore[method-assign]
    with pytest.raises(SystemError):
        forward(rig, commit=True)
