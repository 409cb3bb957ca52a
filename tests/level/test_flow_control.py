import pytest

from delayservice.level.flow_control import FlowControl
from delayservice.level.memory_budget import RECORD_OVERHEAD, MemoryBudget


class Level:
    """What a level's buffer tells the budget: records and bytes held."""

    def __init__(self, budget: MemoryBudget) -> None:
        self.total_buffered = 0
        self.total_bytes = 0
        budget.register(self)

    def hold(self, size: int) -> None:
        self.total_buffered += 1
        self.total_bytes += size

    def release(self, size: int) -> None:
        self.total_buffered -= 1
        self.total_bytes -= size


def _flow(high: int, low: int, max_bytes: int) -> tuple[FlowControl, MemoryBudget]:
    budget = MemoryBudget(max_bytes)
    return FlowControl(high_water=high, low_water=low, budget=budget), budget


def test_a_partition_admits_up_to_the_high_water_mark_and_resumes_at_low():
    flow, budget = _flow(3, 1, 100_000)
    level = Level(budget)
    admitted = 0
    for _ in range(10):
        if not flow.admits(admitted, level.total_buffered, 10):
            break
        level.hold(10)
        admitted += 1
    assert admitted == 3
    assert not flow.may_resume(3)
    assert not flow.may_resume(2)  # low water is 1
    assert flow.may_resume(1)


def test_the_budget_counts_the_per_record_overhead_and_holds_across_levels():
    per_record = 100 + RECORD_OVERHEAD
    flow, budget = _flow(1000, 10, 4 * per_record)
    a, b = Level(budget), Level(budget)
    for _ in range(2):
        assert flow.admits(a.total_buffered, a.total_buffered, 100)
        a.hold(100)
        assert flow.admits(b.total_buffered, b.total_buffered, 100)
        b.hold(100)
    assert budget.used == 4 * per_record
    assert not flow.admits(2, a.total_buffered, 1)  # full, though each level holds only half
    assert not flow.admits(2, b.total_buffered, 1)
    a.release(100)
    a.release(100)
    assert budget.used == 2 * per_record
    assert flow.may_resume(2)  # 50% <= the 75% low-water mark


def test_records_of_the_same_batch_count_before_they_reach_the_buffer():
    per_record = 100 + RECORD_OVERHEAD
    flow, budget = _flow(1000, 10, 3 * per_record)
    level = Level(budget)
    level.hold(100)
    pending = 0
    admitted = 0
    while flow.admits(1 + admitted, 1 + admitted, 100, pending):
        pending += 100 + RECORD_OVERHEAD
        admitted += 1
    assert admitted == 2


def test_an_empty_level_admits_one_oversized_record_so_nothing_wedges():
    flow, budget = _flow(5, 1, 4096)
    busy, idle = Level(budget), Level(budget)
    busy.hold(4000)
    assert not flow.admits(1, busy.total_buffered, 1)
    assert flow.admits(0, idle.total_buffered, 1_000_000)  # other levels filled the budget
    idle.hold(1_000_000)
    assert not flow.admits(1, idle.total_buffered, 1)


def test_water_marks_must_make_sense():
    with pytest.raises(ValueError, match="low_water"):
        FlowControl(high_water=5, low_water=5, budget=MemoryBudget(10))


def test_each_level_sees_the_others_admissions_within_the_recheck_window():
    from delayservice.level.flow_control import RECHECK_EVERY

    per_record = 100 + RECORD_OVERHEAD
    budget = MemoryBudget(10 * RECHECK_EVERY * per_record)
    flow_a, flow_b = FlowControl(10**6, 1, budget), FlowControl(10**6, 1, budget)
    a, b = Level(budget), Level(budget)
    a.hold(100)  # both levels hold something: the budget decides
    b.hold(100)
    while flow_a.admits(a.total_buffered, a.total_buffered, 100):
        a.hold(100)
    assert budget.used <= budget.max_bytes  # one level alone never passes the cap
    admitted_b = 0
    while flow_b.admits(b.total_buffered, b.total_buffered, 100):
        b.hold(100)
        admitted_b += 1
    assert admitted_b == 0  # the first check of B sums every level
    a.release(100)
    a.release(100)
    extra = 0
    while flow_b.admits(b.total_buffered, b.total_buffered, 100):
        b.hold(100)
        extra += 1
    assert extra == 2  # room freed by A is found
    assert budget.used <= budget.max_bytes


def test_a_batch_is_admitted_at_once_while_the_budget_has_room_and_record_by_record_after():
    per_record = 100 + RECORD_OVERHEAD
    flow, budget = _flow(5, 1, 8 * per_record)
    level = Level(budget)
    batch = [b"x" * 90] * 7  # 90 bytes of value + a 10-byte allowance = 100
    assert flow.admit_many(0, 0, batch, 10) == 5  # the partition's high-water mark
    for _ in range(6):
        level.hold(100)
    assert flow.admit_many(0, level.total_buffered, batch, 10) == 2  # the budget's room
    assert flow.admit_many(5, level.total_buffered, batch, 10) == 0
