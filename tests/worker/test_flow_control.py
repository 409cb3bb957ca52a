import pytest

from delayservice.worker.flow_control import FlowControl
from delayservice.worker.ledger import LevelLedger
from delayservice.worker.memory_budget import RECORD_OVERHEAD, MemoryBudget


def _flow(high: int, low: int, max_bytes: int) -> tuple[FlowControl, MemoryBudget]:
    budget = MemoryBudget(max_bytes)
    return FlowControl(high_water=high, low_water=low, budget=budget), budget


def test_a_partition_admits_up_to_the_high_water_mark_and_resumes_at_low():
    flow, budget = _flow(3, 1, 100_000)
    level = LevelLedger(budget)
    p0 = level.assign(0)
    admitted = 0
    for offset in range(10):
        if not flow.admits(level, p0, 10):
            break
        level.track(p0, offset, 10)
        admitted += 1
    assert admitted == 3
    assert not flow.may_resume(level, p0)
    level.settle(p0, 0, 10)
    assert not flow.may_resume(level, p0)  # 2 buffered, low water is 1
    level.settle(p0, 1, 10)
    assert flow.may_resume(level, p0)


def test_the_budget_counts_the_per_record_overhead_and_holds_across_levels():
    per_record = 100 + RECORD_OVERHEAD
    flow, budget = _flow(1000, 10, 4 * per_record)
    a, b = LevelLedger(budget), LevelLedger(budget)
    pa, pb = a.assign(0), b.assign(0)
    for offset in range(2):
        assert flow.admits(a, pa, 100)
        a.track(pa, offset, 100)
        assert flow.admits(b, pb, 100)
        b.track(pb, offset, 100)
    assert budget.used == 4 * per_record
    assert not flow.admits(a, pa, 1)  # full, though each level holds only half
    assert not flow.admits(b, pb, 1)
    a.settle(pa, 0, 100)
    a.settle(pa, 1, 100)
    assert budget.used == 2 * per_record
    assert flow.may_resume(b, pb)  # 50% <= the 75% low-water mark
    b.revoke(0)
    assert budget.used == 0


def test_an_empty_level_admits_one_oversized_record_so_nothing_wedges():
    flow, budget = _flow(5, 1, 4096)
    busy, idle = LevelLedger(budget), LevelLedger(budget)
    p_busy, p_idle = busy.assign(0), idle.assign(0)
    busy.track(p_busy, 0, 4000)
    assert not flow.admits(busy, p_busy, 1)
    assert flow.admits(idle, p_idle, 1_000_000)  # other levels filled the budget
    idle.track(p_idle, 0, 1_000_000)
    assert not flow.admits(idle, p_idle, 1)


def test_water_marks_must_make_sense():
    with pytest.raises(ValueError, match="low_water"):
        FlowControl(high_water=5, low_water=5, budget=MemoryBudget(10))


def test_each_level_sees_the_others_admissions_within_the_recheck_window():
    from delayservice.worker.flow_control import RECHECK_EVERY

    per_record = 100 + RECORD_OVERHEAD
    budget = MemoryBudget(10 * RECHECK_EVERY * per_record)
    flow_a, flow_b = FlowControl(10**6, 1, budget), FlowControl(10**6, 1, budget)
    a, b = LevelLedger(budget), LevelLedger(budget)
    pa, pb = a.assign(0), b.assign(0)
    a.track(pa, 0, 100)  # both levels hold something: the budget decides
    b.track(pb, 0, 100)
    offset = 1
    while flow_a.admits(a, pa, 100):
        a.track(pa, offset, 100)
        offset += 1
    assert budget.used <= budget.max_bytes  # one level alone never passes the cap
    admitted_b = 0
    while flow_b.admits(b, pb, 100):
        b.track(pb, admitted_b + 1, 100)
        admitted_b += 1
    assert admitted_b == 0  # the first check of B sums every level
    a.settle(pa, 0, 100)
    a.settle(pa, 1, 100)
    extra = 0
    while flow_b.admits(b, pb, 100):
        b.track(pb, extra + 1, 100)
        extra += 1
    assert extra == 2  # room freed by A is found
    assert budget.used <= budget.max_bytes
