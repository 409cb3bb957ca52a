"""Scenario 24: the worker layout changed by a kill -9, both ways, exactly-once.

A daemon with one worker per level (`level_workers = "per-level"`, the ids of earlier
versions) is killed mid-stream and started again with one worker for all levels, which
commits in a group of its own: each partition must start where the per-level groups
got to, after the killed process's open transactions are aborted. Then the same the
other way back, where the per-level groups still hold the older offsets of the first
run. A read_committed reader sees every record once, none early.
"""

from __future__ import annotations

import random
import time

import pytest

from tests.faults.harness import scenario_name

pytestmark = pytest.mark.kafka

SEED = 24_024
SCENARIO = "24. worker layout per-level -> shared -> per-level, by kill -9"
LAYOUTS = ("per-level", "shared", "per-level")


def test_changing_the_worker_layout_by_kill_9_loses_and_repeats_nothing(
    fault_run, kafka_bootstrap, fault_summary
):
    rng = random.Random(SEED)
    run = fault_run(kafka_bootstrap, guarantee="exactly-once")
    target = run.target("layout")
    name = f"layout-{run.testbed.tag}"
    daemon = None
    for index, layout in enumerate(LAYOUTS):
        daemon = run.fleet.spawn(name, {"DELAYSERVICE_LEVEL_WORKERS": layout})
        run.wait_ready(daemon, timeout=90)
        if index == 0:
            run.traffic([target], rate=80, seed=SEED)
        time.sleep(rng.uniform(3.0, 5.0))  # traffic goes on under this layout
        if index < len(LAYOUTS) - 1:
            daemon.kill()  # mid-stream, transactions open
    time.sleep(5)
    report = run.drain(scenario_name(SCENARIO, "exactly-once"), timeout=120)
    report.notes.append("each switch by kill -9, a restart under the other layout at once")
    fault_summary(report)
    run.assert_alive()
    assert not report.lost, report.problems()
    assert not report.early, report.problems()
    assert not report.wrong, report.problems()
    assert report.duplicates == 0, report.problems()
