"""The level buffer on its own: per-partition FIFOs and a heap of their heads."""

from __future__ import annotations

import threading
import time

from confluent_kafka import TIMESTAMP_CREATE_TIME

from delayservice.forward.held_record import offset_of
from delayservice.level.partition_group import HANDOVER_MAX, PartitionGroup
from tests.level.fakes import LEVEL_TOPIC, FakeClock, message

DELAY_MS = 5_000
T = LEVEL_TOPIC


def tp(partition: int) -> tuple[str, int]:
    return (T, partition)


def level_group(clock=None, previous_delay_ms: int = 0, on_not_append_time=None):
    """A group of the one level these tests hold (`DELAY_MS`, on `LEVEL_TOPIC`)."""
    delays = [(T, DELAY_MS, previous_delay_ms)]
    if clock is None:
        return PartitionGroup(delays)
    return PartitionGroup(delays, clock.time, on_not_append_time)


def offsets(runs: list[tuple[tuple[str, int], list]]) -> list[tuple[int, int]]:
    return [(tp[1], offset_of(record)) for tp, run in runs for record in run]


def test_heads_leave_in_due_order_across_partitions_and_never_early():
    clock = FakeClock()
    group = level_group(clock)
    now = clock.ms()
    for partition in (0, 1):
        group.assign(tp(partition))
    group.add(tp(0), [message(0, 0, now + 20), message(0, 1, now + 40)], 2, now)
    group.add(tp(1), [message(1, 0, now + 10)], 1, now)
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
    group = level_group(clock)
    now = clock.ms()
    group.assign(tp(0))
    group.add(tp(0), [message(0, 0, now - 6_000), message(0, 1, now + 2_000)], 2, now)
    group.add(tp(0), [message(0, 2, now - 5_500)], 1, now)  # the broker's clock stepped back
    assert offsets(group.take(100)) == [(0, 0)]  # 1 waits, and 2 behind it
    clock.advance(7.0)
    assert offsets(group.take(100)) == [(0, 1), (0, 2)]


def test_records_without_the_brokers_timestamp_are_due_a_level_after_reading():
    clock = FakeClock()
    unstamped: list[int] = []
    group = level_group(clock, on_not_append_time=lambda topic, n: unstamped.append(n))
    now = clock.ms()
    group.assign(tp(0))
    stale = message(0, 0, 0, timestamp_type=TIMESTAMP_CREATE_TIME)  # a 1970 timestamp
    group.add(tp(0), [stale], 1, now)
    clock.advance(4.9)
    assert offsets(group.take(100)) == []
    assert unstamped == [1]  # counted once, when admitted
    clock.advance(0.1)
    assert offsets(group.take(100)) == [(0, 0)]


def _envelope(delay_ms: int, message_id: str, *extra: tuple[str, bytes]) -> list:
    return [
        ("trace", b"t"),
        ("delay-v", b"1"),
        ("delay-target", b"orders"),
        ("delay-ms", str(delay_ms).encode()),
        ("delay-id", message_id.encode()),
        *extra,
    ]


def test_plain_records_are_held_as_their_values_and_the_rest_as_the_clients_messages():
    clock = FakeClock()
    group = level_group(clock, previous_delay_ms=1_000)
    now = clock.ms()
    group.assign(tp(0))
    records = [
        message(0, 0, now, headers=_envelope(5_000, "plain")),
        message(0, 1, now, headers=_envelope(1_000, "a-shorter-level")),
        message(0, 2, now, headers=_envelope(5_000, "due", ("delay-due-ms", b"1"))),
        message(0, 3, now, headers=[("trace", b"no envelope")]),
        message(0, 4, now, headers=_envelope(3_000, "plain-too")),
    ]
    group.add(tp(0), records, 5, now)
    clock.advance(5.0)
    ((_, taken),) = group.take(100)
    assert [type(entry) is tuple for entry in taken] == [True, False, False, False, True]
    assert taken[0][1:] == (
        now + DELAY_MS,
        "orders",
        b"v",
        b"k",
        (("trace", b"t"),),
        b"plain",
        b"5000",
        None,  # no delay-partitioner: placed as the daemon's producer places it
    )
    assert [offset_of(entry) for entry in taken] == [0, 1, 2, 3, 4]


def test_handed_over_records_count_at_once_and_their_bytes_leave_with_them():
    clock = FakeClock()
    group = level_group(clock)
    now = clock.ms()
    group.assign(tp(0))
    group.add(tp(0), [message(0, o, now - DELAY_MS, value=b"x" * o) for o in range(10)], 500, now)
    assert (group.counts[tp(0)], group.total_buffered, group.total_bytes) == (10, 10, 500)
    ((_, taken),) = group.take(4)
    assert len(taken) == 4
    assert group.counts[tp(0)] == 6
    assert 0 < group.total_bytes < 500
    group.take(100)
    assert (group.counts[tp(0)], group.total_buffered, group.total_bytes) == (0, 0, 0)


def test_a_dropped_partition_takes_its_handed_over_records_with_it():
    clock = FakeClock()
    group = level_group(clock)
    now = clock.ms()
    group.assign(tp(0))
    group.add(tp(0), [message(0, 0, now - DELAY_MS)], 100, now)
    group.drop({tp(0)})  # revoked before the forwarder admitted it
    group.assign(tp(0))  # and assigned again: read anew from the last commit
    assert (group.total_buffered, group.total_bytes, group.handed_records) == (0, 0, 0)
    assert group.take(100) == []


def test_the_hand_over_queue_is_bounded_and_admitting_empties_it():
    clock = FakeClock()
    group = level_group(clock)
    now = clock.ms()
    group.assign(tp(0))
    offset = 0
    while not group.handover_full():
        group.add(tp(0), [message(0, offset + n, now) for n in range(100)], 100, now)
        offset += 100
    assert group.handed_records == HANDOVER_MAX
    group.take(100)  # nothing is due, but everything handed over is admitted
    assert not group.handover_full()
    assert group.counts[tp(0)] == HANDOVER_MAX


def test_a_handed_over_record_due_earlier_wakes_the_sleeping_forwarder():
    group = level_group()
    now_ms = int(time.time() * 1000)
    group.assign(tp(0))
    group.add(tp(0), [message(0, 0, now_ms + 3_600_000)], 1, now_ms)  # due in an hour
    woke = threading.Event()

    def forwarder() -> None:
        group.wait(time.time() + 3_600)
        woke.set()

    thread = threading.Thread(target=forwarder, daemon=True)
    thread.start()
    assert not woke.wait(0.2)  # the later record does not wake it
    group.add(tp(0), [message(0, 1, now_ms - DELAY_MS)], 1, now_ms)  # due now
    assert woke.wait(10), "the forwarder slept through a due record"
    group.wake()
    thread.join(10)


def test_a_forward_that_cannot_go_out_is_held_at_its_own_due_time_all_along():
    """The gauges read `earliest_held_ms`: a record taken and still being sent, then put
    back behind a retry's hold, is overdue from its due time on, never "nothing held"
    and never due at the retry's time; once sent, nothing is held."""
    clock = FakeClock()
    group = level_group(clock)
    now = clock.ms()
    group.assign(tp(0))
    group.add(tp(0), [message(0, 0, now), message(0, 1, now + 1)], 2, now)
    due = now + DELAY_MS
    assert group.earliest_held_ms() == due  # handed over, not yet admitted
    clock.advance(5.0)
    (run,) = group.take(1)
    assert group.earliest_held_ms() == due  # in hand: the metadata call may take seconds
    hold = clock.ms() + 1_000
    group.put_back(tp(0), run[1], not_before_ms=hold, incarnation=group.incarnation(tp(0)))
    group.settle()
    assert group.next_due_ms() == hold  # when the forwarder tries again
    assert group.earliest_held_ms() == due  # what the operator sees: overdue since `due`
    clock.advance(1.0)
    taken = group.take(100)
    assert offsets(taken) == [(0, 0), (0, 1)]
    assert group.earliest_held_ms() == due
    group.settle()
    assert group.earliest_held_ms() is None


def test_a_record_without_the_brokers_timestamp_keeps_its_due_time_when_sent_again():
    """An aborted transaction or a failed delivery puts a record back and it is sent
    again: its due time (a level after it was read) must be the same the second time,
    or the forward says it was due in 1970 and counts 56 years late. It is forgotten
    only once the record is committed."""
    clock = FakeClock()
    group = level_group(clock)
    now = clock.ms()
    group.assign(tp(0))
    group.add(tp(0), [message(0, 0, 0, timestamp_type=TIMESTAMP_CREATE_TIME)], 1, now)
    clock.advance(5.0)
    ((partition, run),) = group.take(100)
    assert group.due_of(partition, run[0]) == now + DELAY_MS
    group.put_back(partition, run, incarnation=group.incarnation(partition))
    group.settle()
    ((partition, again),) = group.take(100)
    assert group.due_of(partition, again[0]) == now + DELAY_MS
    group.retire([(partition, again)])
    assert group.overrides == {tp(0): {}}
