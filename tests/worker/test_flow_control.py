import pytest

from delayservice.worker.flow_control import FlowControl
from delayservice.worker.ledger import LevelLedger


def test_a_partition_admits_up_to_the_high_water_mark_and_resumes_at_low():
    flow = FlowControl(high_water=3, low_water=1, max_bytes=10_000)
    level = LevelLedger()
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


def test_the_level_byte_cap_holds_across_partitions():
    flow = FlowControl(high_water=100, low_water=10, max_bytes=1000)
    level = LevelLedger()
    p0, p1 = level.assign(0), level.assign(1)
    level.track(p0, 0, 600)
    assert flow.admits(level, p1, 400)
    level.track(p1, 0, 400)
    assert not flow.admits(level, p1, 1)
    assert not flow.admits(level, p0, 1)
    level.settle(p0, 0, 600)
    assert flow.may_resume(level, p0)  # 400 <= 750


def test_an_empty_level_admits_one_oversized_record_so_nothing_wedges():
    flow = FlowControl(high_water=5, low_water=1, max_bytes=1024)
    level = LevelLedger()
    p0 = level.assign(0)
    assert flow.admits(level, p0, 1_000_000)
    level.track(p0, 0, 1_000_000)
    assert not flow.admits(level, p0, 1)


def test_water_marks_must_make_sense():
    with pytest.raises(ValueError, match="low_water"):
        FlowControl(high_water=5, low_water=5, max_bytes=10)
