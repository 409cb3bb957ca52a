"""The precise forwarder's buffer holds runs, not records: checked against the plain
model it replaced (every record once, never before its fire time, every due record
under the limit taken, the earliest fire time reported)."""

from __future__ import annotations

import math
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from delayservice.envelope import Envelope
from delayservice.precise.storage.slot_record import SlotRecord
from delayservice.precise.wheel.slot_buffer import SlotBuffer

TOPIC = "timers"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(partition: int, offset: int) -> SlotRecord:
    envelope = Envelope("t", 1000, f"id-{partition}-{offset}")
    return SlotRecord(partition, offset, b"k", b"v", [], envelope, 0, None)


_fire = st.integers(0, 40).map(lambda tenth: tenth / 10)
_batch = st.lists(st.tuples(st.integers(0, 2), _fire), min_size=1, max_size=30)
_step = st.one_of(
    st.tuples(st.just("schedule"), _batch),
    st.tuples(st.just("take"), st.tuples(st.integers(1, 25), st.integers(0, 10))),
    st.tuples(st.just("drop"), st.frozensets(st.integers(0, 2), max_size=2)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_step, max_size=40))
def test_the_buffer_gives_each_record_once_never_early_and_every_due_one(steps):
    clock = Clock()
    buffer = SlotBuffer(clock, topic=TOPIC)
    held: dict[tuple[int, int], float] = {}  # the model: (partition, offset) -> fire
    taken: set[tuple[int, int]] = set()
    offsets = iter(range(10**6))
    for kind, arg in steps:
        if kind == "schedule":
            items = []
            for partition, fire in arg:
                record = _record(partition, next(offsets))
                held[(partition, record.offset())] = fire
                items.append((record, fire))
            buffer.schedule_many(items)
        elif kind == "take":
            limit, advance = arg
            clock.now += advance / 10
            got = [r for _, run in buffer.take(limit) for r in run]
            assert len(got) <= limit
            for record in got:
                spot = (record.partition(), record.offset())
                assert spot not in taken, f"{spot} taken twice"
                assert held.pop(spot) <= clock.now, f"{spot} taken early"
                taken.add(spot)
            if len(got) < limit:
                assert all(fire > clock.now for fire in held.values()), "a due record stayed"
        else:
            buffer.drop({(TOPIC, partition) for partition in arg})
            held = {spot: fire for spot, fire in held.items() if spot[0] not in arg}
        assert len(buffer) == len(held)
        expected = math.ceil(min(held.values()) * 1000) if held else None
        assert buffer.next_due_ms() == expected


def test_a_burst_comes_out_in_slices_of_the_limit_in_the_order_it_was_given():
    clock = Clock()
    buffer = SlotBuffer(clock, topic=TOPIC)
    records = [_record(0, o) for o in range(12_000)]
    buffer.schedule_many([(r, 5.0) for r in records[:5_000]])
    buffer.schedule_many([(r, 5.0) for r in records[5_000:]])
    assert buffer.take(5_000) == []
    clock.now = 5.0
    out: list[SlotRecord] = []
    while True:
        runs = buffer.take(5_000)
        if not runs:
            break
        ((tp, run),) = runs
        assert tp == (TOPIC, 0)
        assert len(run) <= 5_000
        out.extend(run)
    assert out == records
    assert len(buffer) == 0


def test_records_put_back_go_again_not_before_their_time():
    clock = Clock()
    buffer = SlotBuffer(clock, topic=TOPIC)
    record = _record(1, 7)
    buffer.put_back((TOPIC, 1), [record], not_before_ms=2_500)
    clock.now = 2.4
    assert buffer.take(10) == []
    clock.now = 2.5
    assert buffer.take(10) == [((TOPIC, 1), [record])]


def test_a_shut_gate_takes_nothing_and_sleeps_until_woken_then_gives_what_is_due():
    clock = Clock()
    buffer = SlotBuffer(clock, topic=TOPIC)
    gate = threading.Event()
    buffer.hold_until(gate)
    buffer.schedule_many([(_record(0, 1), 0.5), (_record(1, 2), 3.0)])
    clock.now = 2.0
    assert buffer.take(10) == []
    assert buffer.next_due_ms() is None  # the forwarder counts as idle
    assert buffer.earliest_held_ms() == 500  # and still says what it holds
    woken = threading.Event()
    sleeper = threading.Thread(target=lambda: (buffer.wait(math.inf), woken.set()))
    sleeper.start()
    assert not woken.wait(0.2)  # a record due at 0.5 does not end the sleep
    gate.set()
    buffer.wake()
    sleeper.join(5)
    assert woken.is_set()
    assert [(tp, [r.offset() for r in rs]) for tp, rs in buffer.take(10)] == [((TOPIC, 0), [1])]
    assert buffer.next_due_ms() == 3000
