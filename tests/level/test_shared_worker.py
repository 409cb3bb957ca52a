"""One worker for several levels, on fakes: one consumer, one forwarder, one producer and
one transaction over every partition of every level it serves (`level_workers =
"shared"`). Each test here runs under the ownership check every fake rig runs under:
a transaction holds a partition's records and offsets only if they were read during
its current assignment."""

from __future__ import annotations

import pytest

from tests.forward.test_commit_path import committed
from tests.level.fakes import (
    LEVEL,
    LEVEL_TOPIC,
    LONGER,
    FakeClock,
    LevelRig,
    make_level_rig,
    message,
)
from tests.level.test_consumer_loop import forward, forwarded, step, subscribed

GUARANTEES = [False, True]
A, B = LEVEL_TOPIC, LONGER.topic


def rig_of_two(clock: FakeClock, exactly_once: bool, **kwargs: object) -> LevelRig:
    return subscribed(
        make_level_rig(clock=clock, exactly_once=exactly_once, levels=(LEVEL, LONGER), **kwargs)  # type: ignore[arg-type]
    )


def put(rig: LevelRig, tp: tuple[str, int], count: int = 1, *, due_in_ms: int = 0) -> None:
    """Append `count` records to `tp`, due `due_in_ms` from now at their level."""
    delay = LEVEL.delay_ms if tp[0] == A else LONGER.delay_ms
    for _ in range(count):
        offset = rig.consumer.next_offset(tp)
        stamp = rig.now_ms() - delay + due_in_ms
        rig.consumer.append(tp, message(tp[1], offset, stamp, topic=tp[0]))


def run(rig: LevelRig, clock: FakeClock, seconds: float = 0.0, passes: int = 3) -> None:
    clock.advance(seconds)
    for _ in range(passes):
        step(rig)
        forward(rig, commit=True)
        step(rig)


def both_committed(rig: LevelRig) -> dict[tuple[str, int], int]:
    if rig.forwarder.transactional:
        out: dict[tuple[str, int], int] = {}
        for _sent, offsets in rig.producer.committed_txns:
            out.update(dict(offsets))
        return out
    return dict(rig.consumer.committed_tps)


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_one_worker_forwards_every_level_earliest_due_first(clock, exactly_once):
    rig = rig_of_two(clock, exactly_once)
    rig.consumer.queue_rebalance("assign", (A, 0), (B, 0))
    put(rig, (B, 0), due_in_ms=100)  # the longer level's record falls due first
    put(rig, (A, 0), due_in_ms=300)
    run(rig, clock)
    assert forwarded(rig) == []  # neither is due
    run(rig, clock, 0.15)
    assert forwarded(rig) == [f"id-{B}-0-0"]
    run(rig, clock, 0.2)
    assert forwarded(rig) == [f"id-{B}-0-0", "id-0-0"]
    assert both_committed(rig) == {(A, 0): 1, (B, 0): 1}
    assert rig.metric("delayservice_forwarded_total", level=LEVEL.name) == 1
    assert rig.metric("delayservice_forwarded_total", level=LONGER.name) == 1
    assert rig.metric("delayservice_consumed_total", level=LONGER.name) == 1
    if exactly_once:  # one transaction per commit point, whatever the levels
        assert all(
            len({tp[0] for tp, _ in offsets}) <= 2 for _, offsets in rig.producer.committed_txns
        )


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_revoke_of_several_levels_commits_them_together_and_forgets_them(clock, exactly_once):
    rig = rig_of_two(clock, exactly_once)
    rig.consumer.queue_rebalance("assign", (A, 0), (A, 1), (B, 0))
    put(rig, (A, 0), 2)
    put(rig, (A, 1), 1)
    put(rig, (B, 0), 2)
    put(rig, (B, 0), due_in_ms=60_000)  # not yet due: dropped with its partition
    step(rig)
    forward(rig)  # everything due sent, nothing committed yet
    rig.consumer.queue_rebalance("revoke", (A, 0), (B, 0))
    step(rig)
    assert both_committed(rig) == {(A, 0): 2, (A, 1): 1, (B, 0): 2}
    if exactly_once:  # one transaction held both levels' records and offsets
        ((sent, offsets),) = rig.producer.committed_txns
        assert {tp[0] for tp, _ in offsets} == {A, B}
        assert len(sent) == 5
    assert rig.loop.owned_partitions == {(A, 1)}
    assert rig.group.total_buffered == 0
    assert rig.group.held == {A: 0, B: 0}
    assert sorted(forwarded(rig)) == sorted(
        ["id-0-0", "id-0-1", "id-1-0", f"id-{B}-0-0", f"id-{B}-0-1"]
    )


def test_a_loss_of_several_levels_commits_nothing_of_theirs_and_the_rest_goes_again(clock):
    """Exactly-once: the open transaction holds records of the lost partitions, so it
    is aborted; what it held of the partitions still owned goes again."""
    rig = rig_of_two(clock, True)
    rig.consumer.queue_rebalance("assign", (A, 0), (B, 0), (B, 1))
    put(rig, (A, 0), 2)
    put(rig, (B, 0), 1)
    put(rig, (B, 1), 1)
    step(rig)
    forward(rig)
    assert rig.producer.txn_open
    rig.consumer.queue_rebalance("lost", (A, 0), (B, 0))
    step(rig)
    assert rig.producer.committed_txns == []
    assert len(rig.producer.aborted) == 4
    run(rig, clock)
    assert forwarded(rig) == [f"id-{B}-1-0"]
    assert both_committed(rig) == {(B, 1): 1}


def test_a_paused_partition_of_one_level_never_stops_reading_of_another(clock):
    """A backlog that fills one level's partition pauses that partition alone."""
    rig = rig_of_two(clock, False, high_water=8, low_water=2)
    rig.consumer.queue_rebalance("assign", (A, 0), (B, 0))
    put(rig, (B, 0), 12, due_in_ms=3_600_000)  # an hour out: it pauses near its mark
    step(rig)
    assert (B, 0) in rig.loop.paused
    for round_ in range(3):
        put(rig, (A, 0), 2)
        run(rig, clock, 0.1, passes=1)
        assert len(forwarded(rig)) == 2 * (round_ + 1)
    assert rig.loop.paused == {(B, 0)}


def test_a_level_holding_nothing_takes_a_record_when_another_level_filled_the_budget(clock):
    """The memory budget is the process's: a level whose records are not due may fill
    it, and every other level still admits one record while it holds none."""
    rig = rig_of_two(clock, False, max_bytes=8192)
    rig.consumer.queue_rebalance("assign", (A, 0), (B, 0))
    for _ in range(4):
        offset = rig.consumer.next_offset((B, 0))
        stamp = rig.now_ms() - LONGER.delay_ms + 3_600_000
        rig.consumer.append((B, 0), message(0, offset, stamp, topic=B, value=b"x" * 3000))
    step(rig)
    assert rig.group.held[B] >= 1
    put(rig, (A, 0), 1)
    run(rig, clock, passes=2)
    assert forwarded(rig) == ["id-0-0"]
    assert committed(rig) == {0: 1}


def test_gauges_are_per_level_and_commit_points_per_worker(clock):
    rig = rig_of_two(clock, True)
    rig.consumer.queue_rebalance("assign", (A, 0), (B, 0), (B, 1))
    put(rig, (B, 0), 3, due_in_ms=10_000)
    step(rig)
    run(rig, clock, passes=1)
    assert rig.metric("delayservice_buffered_messages", level=LONGER.name) == 3
    assert rig.metric("delayservice_buffered_messages", level=LEVEL.name) == 0
    assert rig.metric("delayservice_assigned_partitions", level=LONGER.name) == 2
    assert rig.metric("delayservice_assigned_partitions", level=LEVEL.name) == 1
    due_s = rig.metric("delayservice_next_due_timestamp_seconds", level=LONGER.name)
    assert due_s == pytest.approx(rig.now_ms() / 1000 + 10, abs=0.01)
    assert rig.metric("delayservice_next_due_timestamp_seconds", level=LEVEL.name) == 0
    assert (
        rig.registry.get_sample_value(
            "delayservice_commit_step_seconds_count", {"worker": "levels", "step": "flush"}
        )
        is not None
    )
    assert (
        rig.registry.get_sample_value("delayservice_commits_total", {"level": LEVEL.name}) is None
    )
