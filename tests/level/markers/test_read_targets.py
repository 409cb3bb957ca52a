"""The marker reader's targets: what moves a partition's gate, and how often."""

from __future__ import annotations

from delayservice.level.markers import read_targets
from delayservice.level.markers.read_targets import ReadTargets, Target

MARKERS, OUTCOMES = "m", "o"


def _targets(*ends: int, generation: int = 0) -> ReadTargets:
    targets = ReadTargets(MARKERS)
    for n, end in enumerate(ends):
        targets.note((MARKERS, 0), Target(1_000 + n, end, generation))
    return targets


def test_the_gate_moves_to_the_last_target_passed_and_no_further() -> None:
    targets = _targets(10, 20, 30)
    assert targets.passed({(MARKERS, 0): 25}, now=0.0) == {0: ({0: 1_001}, {})}
    assert targets.markers_pending()
    assert targets.passed({(MARKERS, 0): 29}, now=100.0) == {}
    assert targets.passed({(MARKERS, 0): 30}, now=100.0) == {0: ({0: 1_002}, {})}
    assert not targets.markers_pending()


def test_a_partition_behind_its_newest_target_moves_once_a_step() -> None:
    """Every move wakes the forwarders waiting on the partition: behind a flood, once a
    `BEHIND_STEP_S`, not once a batch read."""
    targets = _targets(10, 20, 30, 40)
    step = read_targets.BEHIND_STEP_S
    assert targets.passed({(MARKERS, 0): 10}, now=50.0) == {0: ({0: 1_000}, {})}
    assert targets.passed({(MARKERS, 0): 20}, now=50.0 + step / 2) == {}
    assert targets.passed({(MARKERS, 0): 30}, now=50.0 + step) == {0: ({0: 1_002}, {})}
    # Read through the newest: it moves at once.
    assert targets.passed({(MARKERS, 0): 40}, now=50.0 + step) == {0: ({0: 1_003}, {})}


def test_a_round_that_passed_nothing_does_not_start_the_step() -> None:
    """The step counts from the last move: a round behind the first target moved
    nothing, so the first target passed moves the gate at once, not a step later."""
    targets = _targets(10, 20, 30)
    assert targets.passed({(MARKERS, 0): 5}, now=50.0) == {}
    assert targets.passed({(MARKERS, 0): 10}, now=50.1) == {0: ({0: 1_000}, {})}


def test_targets_cleared_leave_no_step_behind() -> None:
    """A reopen or a rewind starts the positions over: the first move after it is not
    held back by a step the targets before it began."""
    targets = _targets(10, 20, 30)
    assert targets.passed({(MARKERS, 0): 10}, now=50.0) == {0: ({0: 1_000}, {})}
    targets.clear()
    targets.note((MARKERS, 0), Target(2_000, 10, 1))
    targets.note((MARKERS, 0), Target(2_001, 20, 1))
    assert targets.passed({(MARKERS, 0): 10}, now=50.1) == {1: ({0: 2_000}, {})}
    targets.note((MARKERS, 0), Target(3_000, 30, 2))
    targets.clear_if_older(2)
    targets.note((MARKERS, 0), Target(3_001, 40, 2))
    targets.note((MARKERS, 0), Target(3_002, 50, 2))
    assert targets.passed({(MARKERS, 0): 40}, now=50.2) == {2: ({0: 3_001}, {})}


def test_a_target_with_nothing_appended_since_the_last_replaces_it() -> None:
    targets = _targets(10, 10, 10)
    assert targets.passed({(MARKERS, 0): 10}, now=0.0) == {0: ({0: 1_002}, {})}


def test_a_full_queue_keeps_every_other_target_and_the_oldest() -> None:
    n = read_targets.MAX_TARGETS
    targets = _targets(*range(1, n + 2))  # one more than fits
    reached = targets.passed({(MARKERS, 0): 1}, now=0.0)
    assert reached == {0: ({0: 1_000}, {})}, "the oldest target, nearest to reached, was kept"
    reached = targets.passed({(MARKERS, 0): 2}, now=100.0)
    assert reached == {}, "the second was thinned out: no target ends at 2"
    assert targets.passed({(MARKERS, 0): n + 1}, now=200.0) == {0: ({0: 1_000 + n}, {})}


def test_outcomes_partitions_and_generations_are_kept_apart() -> None:
    targets = ReadTargets(MARKERS)
    targets.note((OUTCOMES, 2), Target(5, 10, 1))
    targets.note((MARKERS, 1), Target(6, 10, 2))
    assert targets.markers_pending()
    reached = targets.passed({(OUTCOMES, 2): 10, (MARKERS, 1): 10}, now=0.0)
    assert reached == {1: ({}, {2: 5}), 2: ({1: 6}, {})}
    targets.note((MARKERS, 1), Target(7, 20, 2))
    targets.clear_if_older(3)
    assert not targets.markers_pending(), "targets of an older generation were kept"
