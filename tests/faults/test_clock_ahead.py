"""Scenario 22: the daemon's host clock runs 2 s ahead of the broker's.

Level due times are the broker's append time plus the level's delay, compared with the
daemon's clock: a clock ahead would forward every record early by as much. The daemon
holds its clock back by the bound its reads give (`delayservice.kafka.broker_clock`).
The clock is moved with libfaketime in the daemon's process alone: the broker, the
producer and the read-back keep the real one, so every record is judged by the
broker's clock.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.faults.full_load import metric_total

pytestmark = pytest.mark.kafka

SEED = 22_022
AHEAD_S = 2
SCENARIO = f"22. daemon clock {AHEAD_S} s ahead of the broker"
LIBFAKETIME = (
    Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"),
    Path("/usr/lib/faketime/libfaketime.so.1"),
)


@pytest.fixture
def libfaketime(unavailable) -> Path:
    for path in LIBFAKETIME:
        if path.exists():
            return path
    unavailable("libfaketime is needed to move the daemon's clock (scripts/setup.sh installs it)")
    raise AssertionError("unreachable")


def test_a_daemon_whose_clock_runs_ahead_forwards_nothing_early(
    fault_run, kafka_bootstrap, fault_summary, libfaketime
):
    run = fault_run(kafka_bootstrap)
    target = run.target("ahead")
    run.fleet.extra_env.update(
        {
            "LD_PRELOAD": str(libfaketime),
            "FAKETIME": f"+{AHEAD_S}s",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }
    )
    daemon = run.fleet.spawn(f"ahead-{run.testbed.tag}")
    run.wait_ready(daemon)
    run.traffic([target], rate=60, seed=SEED)
    time.sleep(12)  # traffic goes on: every level's records fall due meanwhile
    held_back: list[float] = []
    report = run.drain(
        SCENARIO,
        timeout=60,
        while_live=lambda: held_back.append(
            metric_total(daemon, "delayservice_clock_hold_back_seconds")
        ),
    )
    report.notes.append(f"held back {held_back[0]:.3f} s at the end")
    fault_summary(report)
    run.assert_alive()
    assert not report.lost, report.problems()
    assert not report.early, report.problems()
    assert not report.wrong, report.problems()
    assert AHEAD_S <= held_back[0] < AHEAD_S + 1.0, held_back
