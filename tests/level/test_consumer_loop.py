"""The level worker on fakes: due times, seek-back, rebalances, commits, stops, bad input.

Most tests drive one pass of each thread at a time from the test's thread: `step` is
one iteration of the consumer loop (rebalance callbacks and commit results are served
from inside the fake's consume(), as librdkafka serves them from poll), `forward` one
pass of the forwarder (`commit=True` makes it a commit point). A fake clock drives the
buffer, the forwarder and the loop. The last tests start both threads and wait on
conditions.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaError, KafkaException

from tests.level.fakes import (
    DLQ,
    LEVEL,
    LEVEL_TOPIC,
    TARGET,
    ErrorTopicPartition,
    FakeClock,
    LevelRig,
    Sent,
    envelope_headers,
    first_topic,
    kafka_error,
    make_level_rig,
    message,
    wait_for,
)

INF = float("inf")
DELAY = LEVEL.delay_ms


def tp(partition: int) -> tuple[str, int]:
    """A partition of the rig's level topic, as the worker keys it."""
    return (LEVEL_TOPIC, partition)


def subscribed(rig: LevelRig) -> LevelRig:
    """Subscribe as the loop's thread does before its first iteration."""
    rig.loop._subscribe()
    rig.consumer.blocking = False
    return rig


@pytest.fixture
def rig(clock: FakeClock) -> LevelRig:
    return subscribed(make_level_rig(clock=clock))


def step(rig: LevelRig, *, commit: bool = False) -> None:
    """One pass of the consumer loop; `commit`: a commit is due (a retry of one)."""
    loop = rig.loop
    loop._next_commit, loop._next_lag, loop._next_probe = (0.0 if commit else INF), INF, INF
    loop._iteration()


def forward(rig: LevelRig, *, commit: bool = False) -> None:
    """One pass of the forwarder thread; a commit point when `commit`."""
    rig.forwarder.step(commit=commit)


def cycle(rig: LevelRig, times: int = 1) -> None:
    """Read, forward and commit, and let the commit's confirmation come back."""
    for _ in range(times):
        step(rig)
        forward(rig, commit=True)
        step(rig)
        step(rig)


def append(
    rig: LevelRig, partition: int, count: int = 1, *, age_ms: int = DELAY, **kwargs: object
) -> list[int]:
    """Append records to the fake log; by default each is due at once."""
    first = rig.consumer.next_offset(partition)
    offsets = list(range(first, first + count))
    for offset in offsets:
        kwargs.setdefault("timestamp_ms", rig.now_ms() - age_ms)
        rig.consumer.append(partition, message(partition, offset, **kwargs))  # type: ignore[arg-type]
    return offsets


def ids(sent: list[Sent]) -> list[str]:
    return [s.delay_id or "" for s in sent]


def forwarded(rig: LevelRig) -> list[str]:
    """Ids a reader of the target sees (read_committed in exactly-once)."""
    return ids(rig.producer.visible(TARGET))


def dead(rig: LevelRig) -> dict[int, str]:
    """origin offset -> reason, of dead letters a reader sees."""
    return {
        int(s.header("dlq-origin-offset")): s.header("dlq-reason").decode()
        for s in rig.producer.visible(DLQ)
    }


def async_commits(rig: LevelRig) -> list[list[tuple[int, int]]]:
    return [offsets for asynchronous, offsets in rig.consumer.commits if asynchronous]


def sync_commits(rig: LevelRig) -> list[list[tuple[int, int]]]:
    return [offsets for asynchronous, offsets in rig.consumer.commits if not asynchronous]


# -- due times ---------------------------------------------------------------------------
def test_records_are_held_to_their_due_time_and_committed_only_once_flushed(rig, clock):
    rig.consumer.queue_rebalance("assign", 0, 1)
    append(rig, 0, 2, age_ms=0)
    append(rig, 1, 1, age_ms=0)
    step(rig)
    assert rig.loop.first_assignment.is_set()
    assert rig.loop.owned() == [0, 1]
    assert rig.metric("delayservice_consumed_total") == 3
    assert rig.group.total_buffered == 3

    clock.advance(DELAY / 1000 - 0.001)
    forward(rig)
    step(rig)
    assert rig.producer.attempts == []
    clock.advance(0.001)
    rig.producer.hold_reports = True
    forward(rig)
    assert sorted(ids(rig.producer.to(TARGET))) == ["id-0-0", "id-0-1", "id-1-0"]
    assert all(s.at * 1000 >= int(s.header("delay-due-ms")) for s in rig.producer.sent)
    assert all(s.on_delivery is None for s in rig.producer.sent)  # no callback per record

    forward(rig, commit=True)  # the flush times out: nothing is durable yet
    step(rig)
    assert async_commits(rig) == []
    assert rig.metric("delayservice_commit_failures_total") >= 1
    rig.producer.hold_reports = False
    forward(rig, commit=True)
    step(rig)
    assert async_commits(rig)[-1] == [(0, 2), (1, 1)]
    step(rig)  # the broker's confirmation is served from consume()
    assert rig.loop.confirmed == {tp(0): 2, tp(1): 1}
    assert rig.metric("delayservice_commits_total") >= 1
    assert rig.metric("delayservice_forwarded_total") == 3
    assert rig.consumer.committed_offsets == {0: 2, 1: 1}


def test_a_record_is_never_sent_before_its_due_time_whatever_its_neighbours(rig, clock):
    rig.consumer.queue_rebalance("assign", 0, 1)
    append(rig, 0, age_ms=DELAY - 100)
    append(rig, 1, age_ms=DELAY - 50)
    step(rig)
    assert rig.group.next_due_ms() == clock.ms() + 50
    forward(rig)
    assert rig.producer.sent == []
    clock.advance(0.05)
    forward(rig)
    assert ids(rig.producer.sent) == ["id-1-0"]
    clock.advance(0.05)
    forward(rig)
    assert ids(rig.producer.sent) == ["id-1-0", "id-0-0"]


def test_the_clock_offset_is_the_smallest_read_delay_since_it_was_last_published(rig, clock):
    rig.consumer.queue_rebalance("assign", 0, 1)
    append(rig, 0, age_ms=300)
    append(rig, 1, age_ms=120)
    step(rig)
    rig.loop._publish_clock_offset()
    assert rig.metric("delayservice_clock_offset_seconds") == pytest.approx(0.12)


def test_a_host_clock_ahead_of_the_brokers_holds_due_times_back_never_early(clock):
    """This host runs 2 s ahead of the broker: a record read as soon as it was appended
    looks 2 s old. Its level's due time is met by the broker's clock, not this host's:
    it is not forwarded when this host's clock says it is due, only 2 s later."""
    rig = subscribed(make_level_rig(clock=clock, hold_back=True))
    rig.consumer.queue_rebalance("assign", 0)
    step(rig)
    ahead_ms = 2_000
    append(rig, 0, age_ms=ahead_ms)  # appended now, by the broker's clock
    step(rig)
    forward(rig)
    clock.advance(DELAY / 1000 - ahead_ms / 1000 + 0.1)  # due by this host's clock
    cycle(rig)
    assert forwarded(rig) == [], "forwarded early by the broker's clock"
    clock.advance(ahead_ms / 1000)  # due by the broker's clock
    cycle(rig)
    assert forwarded(rig) == ["id-0-0"]


def test_an_envelope_asking_more_than_its_level_is_re_published_where_it_fits(rig, clock):
    rig.consumer.queue_rebalance("assign", 0)
    append_ms = clock.ms()
    append(rig, 0, age_ms=0, headers=envelope_headers(message_id="long", delay_ms=30_000))
    append(rig, 0, age_ms=0, headers=envelope_headers(message_id="huge", delay_ms=120_000))
    append(rig, 0, age_ms=0)
    step(rig)
    clock.advance(DELAY / 1000)
    forward(rig, commit=True)
    step(rig)
    assert rig.metric("delayservice_level_mismatches_total", kind="delay_above_level") == 1
    assert dead(rig) == {1: "delay_out_of_range"}  # above the top level: never held early
    assert forwarded(rig) == ["id-0-2"]  # the partition moved on
    (copy,) = rig.producer.to("delay_topic_4")  # 25 s remain: the 60 s level holds them
    assert copy.header("delay-due-ms") == str(append_ms + 30_000).encode()
    assert copy.header("delay-id") == b"long"
    assert int(copy.header("delay-ms")) == 30_000 - DELAY
    assert async_commits(rig)[-1] == [(0, 3)]


def test_a_re_published_record_goes_to_the_precise_topic_when_precise_mode_runs(clock):
    rig = subscribed(make_level_rig(clock=clock, precise_topic="delay_precise"))
    rig.consumer.queue_rebalance("assign", 0)
    due = clock.ms() + 12_345
    append(
        rig,
        0,
        age_ms=0,
        headers=[*envelope_headers(message_id="x"), ("delay-due-ms", str(due).encode())],
    )
    step(rig)
    clock.advance(DELAY / 1000)
    forward(rig, commit=True)
    (copy,) = rig.producer.to("delay_precise")
    assert copy.header("delay-due-ms") == str(due).encode()
    assert copy.header("delay-ms") == b"0"  # the absolute due time alone decides


def test_a_create_time_record_is_due_a_level_after_it_was_read(rig, clock):
    rig.consumer.queue_rebalance("assign", 0)
    created = clock.ms() - 3_600_000  # an hour-old producer timestamp proves nothing
    append(rig, 0, timestamp_ms=created, timestamp_type=TIMESTAMP_CREATE_TIME)
    clock.advance(2.0)
    read_ms = clock.ms()
    step(rig)
    forward(rig)  # admitted: counted, and held
    assert rig.metric("delayservice_level_mismatches_total", kind="not_append_time") == 1
    clock.advance(DELAY / 1000 - 0.001)
    forward(rig)
    assert rig.producer.to(TARGET) == []
    clock.advance(0.001)
    forward(rig)
    (sent,) = rig.producer.to(TARGET)
    assert sent.header("delay-due-ms") == str(read_ms + DELAY).encode()


# -- flow control ------------------------------------------------------------------------
def test_a_refused_record_pauses_its_partition_seeks_back_and_resumes_after_draining(clock):
    rig = subscribed(make_level_rig(clock=clock, high_water=3, low_water=1))
    rig.consumer.queue_rebalance("assign", 0, 1)
    append(rig, 0, 6, age_ms=0)
    append(rig, 1, 1, age_ms=0)
    step(rig)
    assert rig.consumer.pauses == [[0]]
    assert rig.consumer.seeks == [(0, 3)]  # back to the refused record
    assert rig.loop.paused == {tp(0)}
    assert rig.group.counts == {tp(0): 3, tp(1): 1}
    step(rig)
    assert rig.group.counts[tp(0)] == 3  # nothing read while paused
    assert rig.consumer.resumes == [[0, 1]]  # only the resume of the fresh assignment

    clock.advance(DELAY / 1000)
    forward(rig)
    step(rig)
    assert rig.loop.paused == set()
    assert rig.consumer.resumes[-1] == [0]
    for _ in range(4):
        step(rig)
        forward(rig)
    # Every record once, in order, none skipped by the pause.
    forward(rig, commit=True)
    step(rig)
    assert [i for i in forwarded(rig) if i.startswith("id-0-")] == [f"id-0-{o}" for o in range(6)]
    step(rig)
    assert rig.consumer.committed_offsets == {0: 6, 1: 1}


def test_a_backlog_of_due_records_pauses_its_partition_and_the_others_are_read_on(clock):
    """A partition behind its forwarder is paused near its mark like any other: waiting
    for the forwarder instead would stop every partition and every level the consumer
    reads."""
    rig = subscribed(make_level_rig(clock=clock, high_water=8, low_water=2))
    rig.consumer.queue_rebalance("assign", 0, 1)
    append(rig, 0, 6)  # due at once; pause_at is 6
    step(rig)
    assert rig.consumer.pauses == [[0]]
    append(rig, 1, 2)
    step(rig)
    assert rig.group.counts[tp(1)] == 2  # read on while partition 0 waits
    for _ in range(3):
        forward(rig)
        step(rig)
    assert rig.loop.paused == set()  # drained: resumed
    assert rig.consumer.seeks == []


def test_records_not_yet_due_pause_their_partition_near_the_mark_without_a_seek(clock):
    rig = subscribed(make_level_rig(clock=clock, high_water=8, low_water=2))
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 6, age_ms=0)
    step(rig)
    assert rig.consumer.pauses == [[0]]
    assert rig.consumer.seeks == []


def test_the_memory_budget_pauses_too_and_an_empty_level_still_takes_one_record(clock):
    rig = subscribed(make_level_rig(clock=clock, max_bytes=4096))
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 3, value=b"x" * 3000)
    step(rig)
    assert rig.group.counts[tp(0)] == 1  # one oversized record is let in
    assert rig.consumer.seeks == [(0, 1)]
    for _ in range(6):
        forward(rig)
        step(rig)
    forward(rig, commit=True)
    assert forwarded(rig) == ["id-0-0", "id-0-1", "id-0-2"]
    assert rig.budget.used == 0


# -- rebalancing -------------------------------------------------------------------------
def prepare_two_partitions(rig: LevelRig) -> None:
    """p0: offsets 0 and 1 sent in the open interval, 2 not yet due; p1: 0 not yet due."""
    rig.consumer.queue_rebalance("assign", 0, 1)
    append(rig, 0, 2)
    append(rig, 0, age_ms=0)
    append(rig, 1, age_ms=0)
    step(rig)
    forward(rig)
    assert ids(rig.producer.to(TARGET)) == ["id-0-0", "id-0-1"]
    assert rig.consumer.commits == []


def test_a_revoke_mid_interval_flushes_commits_what_was_sent_and_drops_the_rest(rig, clock):
    prepare_two_partitions(rig)
    rig.producer.hold_reports = True
    rig.consumer.queue_rebalance("revoke", 0)
    rig.producer.hold_reports = False
    step(rig)
    assert sync_commits(rig) == [[(0, 2)]]  # synchronously, what the flush made durable
    assert async_commits(rig) == []
    assert rig.loop.owned() == [1]
    assert rig.group.total_buffered == 1  # p0's not-yet-due record is gone from the buffer

    clock.advance(DELAY / 1000)
    forward(rig, commit=True)
    step(rig)
    assert forwarded(rig) == ["id-0-0", "id-0-1", "id-1-0"]
    assert async_commits(rig) == [[(1, 1)]]
    assert rig.metric("delayservice_loop_errors_total", thread="consumer") == 0


@pytest.mark.parametrize("failure", ["raises", "partition_error"])
def test_a_failed_commit_on_revoke_is_counted_and_survived(rig, failure):
    prepare_two_partitions(rig)
    if failure == "raises":
        rig.consumer.commit_raises = KafkaException(kafka_error(KafkaError.REBALANCE_IN_PROGRESS))
    else:
        rig.consumer.commit_outcome = lambda offsets: (
            None,
            [
                ErrorTopicPartition(
                    tp.topic, tp.partition, tp.offset, kafka_error(KafkaError.REQUEST_TIMED_OUT)
                )
                for tp in offsets
            ],
        )
    rig.consumer.queue_rebalance("revoke", 0)
    step(rig)
    assert sync_commits(rig) == [[(0, 2)]]
    assert rig.consumer.committed_offsets == {}
    assert rig.loop.owned() == [1]
    assert rig.metric("delayservice_commit_failures_total") == 1
    assert rig.metric("delayservice_commits_total") == 1  # the forwarder's commit point
    assert rig.metric("delayservice_loop_errors_total", thread="consumer") == 0


def test_a_lost_partition_is_dropped_without_a_commit(rig, clock):
    prepare_two_partitions(rig)
    rig.consumer.queue_rebalance("lost", 0)
    step(rig)
    assert rig.consumer.commits == []
    assert rig.loop.owned() == [1]
    assert rig.group.total_buffered == 1
    clock.advance(DELAY / 1000)
    forward(rig, commit=True)
    step(rig)
    assert [p for offsets in async_commits(rig) for p, _o in offsets] == [1]


def _paused_then_gone(clock: Any, how: str) -> LevelRig:
    """Partition 0 filled to its mark and paused, then taken away (`how`: revoke, lost)."""
    rig = subscribed(make_level_rig(clock=clock, high_water=2, low_water=0))
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 4, age_ms=0)
    step(rig)
    assert rig.consumer.paused == {0}
    rig.consumer.queue_rebalance(how, 0)
    step(rig)
    return rig


def test_a_reassigned_partition_is_resumed_though_the_client_remembers_its_pause(clock):
    rig = _paused_then_gone(clock, "revoke")
    assert rig.loop.paused == set()
    assert rig.consumer.paused == {0}  # librdkafka keeps the pause across re-assignment
    rig.consumer.queue_rebalance("assign", 0)
    step(rig)
    step(rig)
    assert rig.consumer.paused == {0}  # filled up again, from the committed offset
    assert rig.group.counts[tp(0)] == 2
    assert [0] in rig.consumer.resumes


# -- commit results -----------------------------------------------------------------------
def sent_on_two_partitions(rig: LevelRig) -> None:
    rig.consumer.queue_rebalance("assign", 0, 1)
    append(rig, 0, 2)
    append(rig, 1, 1)
    step(rig)
    forward(rig, commit=True)


def test_a_confirmed_commit_counts_and_is_not_asked_again(rig):
    sent_on_two_partitions(rig)
    step(rig)
    step(rig)
    assert rig.metric("delayservice_commits_total") == 2  # the commit point and the commit
    assert rig.metric("delayservice_commit_failures_total") == 0
    step(rig)
    assert async_commits(rig) == [[(0, 2), (1, 1)]]


def test_a_commit_failing_as_a_whole_counts_nothing_and_is_asked_again(rig, clock):
    sent_on_two_partitions(rig)
    rig.consumer.commit_outcome = lambda offsets: (
        kafka_error(KafkaError.REBALANCE_IN_PROGRESS),
        list(offsets),
    )
    step(rig)
    step(rig)
    assert rig.metric("delayservice_commit_failures_total") == 1
    assert rig.consumer.committed_offsets == {}
    step(rig, commit=True)
    assert async_commits(rig) == [[(0, 2), (1, 1)], [(0, 2), (1, 1)]]


def test_a_partition_failing_in_a_commit_is_asked_again_alone(rig, clock):
    sent_on_two_partitions(rig)

    def half(offsets):
        return None, [
            ErrorTopicPartition(
                tp.topic, tp.partition, tp.offset, kafka_error(KafkaError.REQUEST_TIMED_OUT)
            )
            if tp.partition == 1
            else tp
            for tp in offsets
        ]

    rig.consumer.commit_outcome = half
    step(rig)
    step(rig)
    assert rig.metric("delayservice_commit_failures_total") == 1
    step(rig, commit=True)
    assert async_commits(rig)[-1] == [(1, 1)]


def test_no_offset_to_commit_is_not_a_failure(rig):
    rig.loop.on_commit(kafka_error(KafkaError._NO_OFFSET), [])
    assert rig.metric("delayservice_commit_failures_total") == 0


# -- bad input and surprises ------------------------------------------------------------
def raw(**fields: object) -> list[tuple[str, object]]:
    """Envelope headers as bytes on the wire, with some fields replaced (None drops one)."""
    wire: dict[str, object] = {
        "delay-v": b"1",
        "delay-target": TARGET.encode(),
        "delay-ms": b"5000",
        "delay-id": b"x",
    }
    wire.update({name.replace("_", "-"): value for name, value in fields.items()})
    return [(name, value) for name, value in wire.items() if value is not ...]


# (headers as the consumer returns them, dead-letter reason or None when forwarded)
HOSTILE: list[tuple[object, str | None]] = [
    (None, "invalid_envelope"),
    ([("trace", b"no envelope here")], "invalid_envelope"),
    (raw(delay_target=b"\xed\xb3\xbf"), "invalid_envelope"),  # a UTF-8-encoded lone surrogate
    (raw(delay_target=b"\xff\xfe"), "invalid_envelope"),
    (raw(delay_target=None), "invalid_envelope"),
    (raw(delay_target=...), "invalid_envelope"),
    ([*raw(), ("delay-v", b"1")], "invalid_envelope"),
    (raw(delay_v=b"2"), "invalid_envelope"),
    (raw(delay_v=b"01"), "invalid_envelope"),
    (raw(delay_ms=b"9" * 40), "invalid_envelope"),
    (raw(delay_ms=b"-5"), "invalid_envelope"),
    (raw(delay_ms=b" 5000"), "invalid_envelope"),
    (raw(delay_ms="٣".encode()), "invalid_envelope"),
    (raw(delay_id=b""), "invalid_envelope"),
    (raw(delay_partition=b"99999999999"), "invalid_envelope"),
    (raw(delay_target=b"or\x00ders"), "invalid_target"),
    (raw(delay_target=b"__consumer_offsets"), "invalid_target"),
    (raw(delay_target=LEVEL_TOPIC.encode()), "invalid_target"),
    (raw(delay_target=DLQ.encode()), "invalid_target"),
    (raw(delay_target=b"x" * 300), "invalid_target"),
    (raw(delay_target=b"no-such-topic"), "unknown_topic"),
    (raw(delay_partition=b"7"), "unknown_partition"),  # the target has 3
    (raw(delay_ms=str(10**12).encode()), "delay_out_of_range"),
    (raw(delay_due_ms=str(10**14).encode()), "delay_out_of_range"),
    ([("\x00", None), ("", b""), ("ünï", b"\x00\xff" * 1000), *raw()], None),
    ([("big", b"\xfe" * 300_000), *raw()], None),
    (dict(raw()), None),
]


def test_hostile_headers_never_stop_the_loop_and_every_offset_commits(rig):
    rig.consumer.queue_rebalance("assign", 0)
    expected: dict[int, str] = {}
    good = []
    for headers, outcome in HOSTILE:
        (before,) = append(rig, 0)
        good.append(before)
        (offset,) = append(rig, 0, headers=headers)
        if outcome is not None:
            expected[offset] = outcome
        else:
            good.append(offset)
    cycle(rig, 3)

    assert dead(rig) == expected
    assert len(forwarded(rig)) == len(good)
    assert async_commits(rig)[-1] == [(0, 2 * len(HOSTILE))]
    assert rig.group.total_buffered == 0
    assert rig.metric("delayservice_dead_lettered_total", reason="invalid_envelope") == 15
    assert rig.metric("delayservice_loop_errors_total", thread="consumer") == 0
    assert rig.metric("delayservice_loop_errors_total", thread="forwarder") == 0


def test_an_unexpected_produce_exception_dead_letters_that_record_and_the_loop_goes_on(rig):
    def on_produce(sent: Sent) -> None:
        if sent.topic == TARGET and sent.delay_id == "id-0-1":
            raise RuntimeError("boom")

    rig.producer.on_produce = on_produce
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 3)
    cycle(rig)
    append(rig, 0, 2)
    cycle(rig)
    assert forwarded(rig) == ["id-0-0", "id-0-2", "id-0-3", "id-0-4"]
    assert dead(rig) == {1: "internal_error"}
    assert async_commits(rig)[-1] == [(0, 5)]
    assert rig.metric("delayservice_loop_errors_total", thread="consumer") == 0


def test_an_exception_in_a_dead_letter_produce_costs_no_other_record(rig, clock):
    """Invariant 7: one record's exception never escapes to the thread's loop. Here a
    record bound for the dead-letter topic (no envelope) makes every produce raise."""

    def on_produce(sent: Sent) -> None:
        if sent.topic == DLQ:  # the copy and the stub alike
            raise RuntimeError("boom")

    rig.producer.on_produce = on_produce
    rig.consumer.queue_rebalance("assign", 0, 1)
    append(rig, 0)
    append(rig, 0, key=b"cursed", headers=[("no", b"envelope")])
    append(rig, 0, 2)
    append(rig, 1, 2)
    cycle(rig, 2)
    # The cursed record waits (its partition from it on), never committed past unsent;
    # the other partition goes on.
    assert forwarded(rig) == ["id-0-0", "id-1-0", "id-1-1"]
    assert rig.consumer.committed_offsets == {0: 1, 1: 2}
    rig.producer.on_produce = None
    clock.advance(2.0)
    cycle(rig, 2)
    assert forwarded(rig)[-2:] == ["id-0-2", "id-0-3"]
    assert dead(rig) == {1: "invalid_envelope"}
    assert rig.consumer.committed_offsets == {0: 4, 1: 2}


def test_consume_errors_are_reported_and_survived(rig):
    fatal = kafka_error(KafkaError._FATAL, fatal=True)
    rig.consumer.queue_rebalance("assign", 0)
    rig.consumer.injected.extend([
        message(0, 0, 0, error=kafka_error(KafkaError._PARTITION_EOF)),
        message(0, 0, 0, error=kafka_error(KafkaError._ALL_BROKERS_DOWN)),
    ])  # fmt: skip
    step(rig)
    assert rig.loop.broker_down
    assert rig.fatal == []
    append(rig, 0)
    step(rig)
    assert not rig.loop.broker_down  # a record arrived: the broker is back
    rig.consumer.injected.append(message(0, 0, 0, error=fatal))
    step(rig)
    assert rig.fatal == []  # a fatal consumer error is the client's: it gets replaced
    assert rig.loop.keeper.failed is not None
    forward(rig, commit=True)
    assert forwarded(rig) == ["id-0-0"]


def surviving_step(rig: LevelRig) -> None:
    """`step`, with the loop's own handling of an exception that escapes an iteration."""
    try:
        step(rig)
    except Exception as exc:
        rig.loop._stopping.set()  # _survive's pause returns at once
        try:
            rig.loop._survive(exc)
        finally:
            rig.loop._stopping.clear()


class _FailingFirst:
    """A client call whose first use raises `code`; it counts its uses (`made`)."""

    def __init__(self, call: Any, code: int) -> None:
        self.call = call
        self.code = code
        self.made = 0

    def __call__(self, *args: Any) -> Any:
        self.made += 1
        if self.made == 1:
            raise KafkaException(kafka_error(self.code))
        return self.call(*args)


@pytest.mark.parametrize("where", ["admit", "resume"])
def test_an_exception_after_consume_reads_the_batch_again_instead_of_skipping_it(rig, where):
    """consume() has moved the client past every record it returned: when the iteration
    raises before they are all admitted, the partitions not admitted are sought back to
    their first record in the batch, and nothing is skipped or committed past."""
    rig.consumer.queue_rebalance("assign", 0, 1)
    step(rig)
    append(rig, 0, 3)
    append(rig, 1, 3)
    if where == "admit":
        add = rig.group.add
        calls = {"n": 0}

        def add_failing_second(*args, **kwargs):  # partition 0 admitted, 1 not
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("broken admission")
            add(*args, **kwargs)

        rig.group.add = add_failing_second
    else:  # caught where it is called: the batch is admitted, the resume tried again
        rig.loop._reading.to_resume_on_assign.append(tp(0))
        rig.consumer.resume = _FailingFirst(rig.consumer.resume, KafkaError._TRANSPORT)
    surviving_step(rig)
    assert rig.metric("delayservice_loop_errors_total", thread="consumer") == 1
    append(rig, 0, 1)
    append(rig, 1, 1)
    cycle(rig, 3)
    assert sorted(forwarded(rig)) == sorted(
        [f"id-0-{o}" for o in range(4)] + [f"id-1-{o}" for o in range(4)]
    )
    assert rig.consumer.committed_offsets == {0: 4, 1: 4}


def test_a_resume_that_fails_after_a_re_assignment_is_tried_again(clock):
    """A partition paused by flow control is lost and assigned again; librdkafka keeps
    its pause, and the resume of the fresh assignment raises once. It is resumed at a
    later turn, not left paused for good (found by the level simulation: its records
    were held past a minute without faults)."""
    rig = _paused_then_gone(clock, "lost")
    calls = rig.consumer.resume = _FailingFirst(rig.consumer.resume, KafkaError._TRANSPORT)
    rig.consumer.queue_rebalance("assign", 0)
    step(rig)
    assert calls.made == 1
    assert rig.consumer.paused == {0}
    assert rig.metric("delayservice_loop_errors_total", thread="consumer") == 1
    step(rig)
    assert calls.made == 2
    assert [0] in rig.consumer.resumes
    step(rig)
    assert rig.group.counts[tp(0)] == 2  # read again from the start, up to the mark


def test_a_seek_that_fails_keeps_every_rewind_for_the_next_iteration(rig):
    rig.consumer.queue_rebalance("assign", 0, 1)
    step(rig)
    rig.loop._reading.rewind.update({tp(0): 0, tp(1): 0})
    rig.consumer.seek = _FailingFirst(rig.consumer.seek, KafkaError._STATE)
    with pytest.raises(KafkaException):
        rig.loop._admission.apply_rewinds()
    assert set(rig.loop._reading.rewind) == {tp(0), tp(1)}  # the failed one and the one after it
    rig.loop._admission.apply_rewinds()
    assert rig.loop._reading.rewind == {}
    assert sorted(rig.consumer.seeks) == [(0, 0), (1, 0)]


# -- the loop's own thread --------------------------------------------------------------
def start(rig: LevelRig) -> None:
    rig.forwarder.start()
    rig.loop.start()


def stop(rig: LevelRig, timeout: float = 5.0) -> bool:
    rig.loop.request_stop()
    stopped = rig.loop.join(timeout)
    rig.forwarder.stop(timeout=1.0)
    return stopped


@pytest.mark.parametrize("exactly_once", [False, True])
def test_the_threads_forward_on_time_commit_and_stop_cleanly(exactly_once):
    rig = make_level_rig(commit_interval_s=0.05, exactly_once=exactly_once)
    rig.consumer.queue_rebalance("assign", 0, 1)
    start(rig)
    try:
        wait_for(rig.loop.first_assignment.is_set, "the first assignment")
        for p in (0, 1):
            append(rig, p, 5, age_ms=DELAY - 150)  # due in 150 ms
        if exactly_once:
            wait_for(lambda: len(forwarded(rig)) == 10, "every record committed")
        else:
            wait_for(
                lambda: rig.consumer.committed_offsets == {0: 5, 1: 5}, "every offset committed"
            )
        rig.consumer.queue_rebalance("revoke", 1)
        wait_for(lambda: rig.loop.owned() == [0], "the revoke")
    finally:
        assert stop(rig)
    assert rig.consumer.closed
    assert not rig.forwarder.is_alive()
    assert sorted(forwarded(rig)) == sorted(f"id-{p}-{o}" for p in (0, 1) for o in range(5))
    for sent in rig.producer.to(TARGET):
        assert sent.at * 1000 >= int(sent.header("delay-due-ms"))
    assert rig.metric("delayservice_loop_errors_total", thread="forwarder") == 0
    if exactly_once:
        committed_txns = rig.producer.committed_txns
        assert sorted(o for _sent, offsets in committed_txns for o in first_topic(offsets))[
            -2:
        ] == [(0, 5), (1, 5)]
        assert rig.consumer.commits == []  # the offsets travel in the transactions
    assert rig.fatal == []


def full_queue(_sent: Sent) -> None:
    raise BufferError("Local: Queue full")


def test_a_stop_with_a_full_producer_queue_commits_nothing_unsent():
    rig = make_level_rig(commit_interval_s=0.02)
    rig.producer.on_produce = full_queue
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 3)
    start(rig)
    try:
        wait_for(lambda: len(rig.producer.attempts) >= 3, "the full queue to be hit")
    finally:
        started = time.monotonic()
        stopped = stop(rig)
    assert stopped
    assert time.monotonic() - started < 2.0
    assert rig.producer.sent == []
    assert rig.consumer.closed
    assert all(offset == 0 for _a, offsets in rig.consumer.commits for _p, offset in offsets)
    assert rig.consumer.committed_offsets.get(0, 0) == 0


# -- a consumer that hit a fatal error -----------------------------------------------------
def test_a_fenced_consumer_is_replaced_and_what_it_held_is_re_read(rig):
    """After a coordinator failover librdkafka can fence a static member's commit; the
    loop replaces the client instead of stopping, and drops what it held uncommitted."""
    from delayservice.kafka.consumer_keeper import REPLACEMENTS_ALLOWED

    prepare_two_partitions(rig)
    fenced = KafkaError(KafkaError._FATAL, "Static consumer fenced", fatal=True)
    rig.loop.on_error(fenced)
    assert rig.loop._replace_client(rig.loop.keeper)
    assert rig.consumer.closed
    assert rig.loop.owned() == []
    assert not rig.loop.first_assignment.is_set()  # not ready until assigned again
    assert rig.group.total_buffered == 0
    assert rig.consumer.commits == []  # nothing committed past what was made durable
    assert rig.metric("delayservice_consumer_rebuilds_total") == 1
    assert rig.fatal == []

    for _ in range(REPLACEMENTS_ALLOWED - 1):
        rig.loop.on_error(fenced)
        assert rig.loop._replace_client(rig.loop.keeper)
    rig.loop.on_error(fenced)
    assert not rig.loop._replace_client(
        rig.loop.keeper
    )  # fenced again and again: another process has the name
    assert "instance_name" in rig.fatal[0]


def test_a_level_that_stays_unassigned_after_losing_its_partitions_gets_a_new_consumer(rig, clock):
    """After a broker freeze librdkafka can lose the assignment and never rejoin; the
    loop notices (and reports not ready) and replaces the client."""
    prepare_two_partitions(rig)
    rig.consumer.queue_rebalance("lost", 0, 1)
    step(rig)
    assert rig.loop.unassigned_since == clock.monotonic()
    clock.advance(29.0)  # within the rejoin timeout (30 s in the rig): keep waiting
    step(rig)
    assert rig.loop.keeper.failed is None
    clock.advance(2.0)
    step(rig)
    assert "no assignment" in (rig.loop.keeper.failed or "")
    assert rig.loop._replace_client(rig.loop.keeper)
    assert rig.loop.unassigned_since is None
    rig.consumer.queue_rebalance("assign", 0, 1)
    step(rig)
    assert rig.loop.owned() == [0, 1]
    assert rig.loop.first_assignment.is_set()
    assert rig.fatal == []


def test_an_empty_assignment_is_not_taken_for_a_lost_one(rig, clock):
    """An instance the group gives nothing (more instances than partitions) is idle by
    design and must not rejoin over and over."""
    rig.consumer.queue_rebalance("assign")
    step(rig)
    assert rig.loop.first_assignment.is_set()
    clock.advance(3600)
    step(rig)
    assert rig.loop.unassigned_since is None
    assert rig.loop.keeper.failed is None


def test_readiness_reads_the_owned_partitions_while_a_rebalance_changes_them(rig: LevelRig):
    """`owned()` runs on the HTTP thread (readiness) while the consumer thread takes
    partitions and lets them go: a revoke landing in the middle of its read must not
    fail it ("Set changed size during iteration" made /readyz answer 500)."""
    rig.consumer.queue_rebalance("assign", 0, 1, 2)
    step(rig)
    assert rig.loop.owned(LEVEL_TOPIC) == [0, 1, 2]
    revoked: list[int] = []

    def revoke_midway() -> None:
        if revoked:  # once: the consumer's own reads of the set come through here too
            return
        revoked.append(1)
        rig.consumer.queue_rebalance("revoke", 1)
        step(rig)

    class Interleaved(type(rig.loop.owned_partitions)):  # type: ignore[misc]
        """Runs the revoke on the consumer's side after the reader's first element."""

        def __iter__(self):  # type: ignore[no-untyped-def]
            it = super().__iter__()
            yield next(it)
            revoke_midway()
            yield from it

    rig.loop.owned_partitions = Interleaved(rig.loop.owned_partitions)
    assert rig.loop.owned(LEVEL_TOPIC) == [0, 1, 2]  # what was owned when it began
    assert revoked == [1]
    assert rig.loop.owned(LEVEL_TOPIC) == [0, 2]
