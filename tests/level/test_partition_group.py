"""The level buffer on its own: per-partition FIFOs and a heap of their heads."""

from __future__ import annotations

from confluent_kafka import TIMESTAMP_CREATE_TIME

from delayservice.level.partition_group import PartitionGroup
from tests.level.fakes import FakeClock, message

DELAY_MS = 5_000


def offsets(runs: list[tuple[int, list]]) -> list[tuple[int, int]]:
    return [(partition, record.offset()) for partition, run in runs for record in run]


def test_heads_leave_in_due_order_across_partitions_and_never_early():
    clock = FakeClock()
    group = PartitionGroup(DELAY_MS, clock.time)
    now = clock.ms()
    for partition in (0, 1):
        group.assign(partition)
    group.add(0, [message(0, 0, now + 20), message(0, 1, now + 40)], 2, now)
    group.add(1, [message(1, 0, now + 10)], 1, now)
    clock.advance(5.0)
    assert offsets(group.take(100)) == []  # 10 ms short of the first due time
    clock.advance(0.02)
    assert offsets(group.take(100)) == [(1, 0), (0, 0)]
    clock.advance(0.02)
    assert offsets(group.take(100)) == [(0, 1)]
    assert len(group) == 0


def test_a_broker_clock_stepping_back_makes_a_record_late_never_early():
    """A due tail does not mean a due backlog when append times went backwards: the
    record in the middle, appended before the step, is not due yet."""
    clock = FakeClock()
    group = PartitionGroup(DELAY_MS, clock.time)
    now = clock.ms()
    group.assign(0)
    group.add(0, [message(0, 0, now - 6_000), message(0, 1, now + 2_000)], 2, now)
    group.add(0, [message(0, 2, now - 5_500)], 1, now)  # the broker's clock stepped back
    assert offsets(group.take(100)) == [(0, 0)]  # 1 waits, and 2 behind it
    clock.advance(7.0)
    assert offsets(group.take(100)) == [(0, 1), (0, 2)]


def test_records_without_the_brokers_timestamp_are_due_a_level_after_reading():
    clock = FakeClock()
    group = PartitionGroup(DELAY_MS, clock.time)
    now = clock.ms()
    group.assign(0)
    stale = message(0, 0, 0, timestamp_type=TIMESTAMP_CREATE_TIME)  # a 1970 timestamp
    assert group.add(0, [stale], 1, now) == 1
    clock.advance(4.9)
    assert offsets(group.take(100)) == []
    clock.advance(0.1)
    assert offsets(group.take(100)) == [(0, 0)]
