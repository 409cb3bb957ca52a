"""Scenario 2: kill -9 at seeded random moments, each followed by a restart under the
same instance name, with continuous traffic.

Invariants 2 and 8: a crash only causes re-reading, and a restarted daemon reclaims
its partitions at once through static membership, so it costs seconds of lateness,
not a session timeout.
"""

from __future__ import annotations

import math
import random
import time

import pytest

from tests.faults.harness import now_ms, scenario_name, wait_until
from tests.faults.measure import percentile, recovery_s

pytestmark = pytest.mark.kafka

SEED = 9_001
RESTARTS = 20
SESSION_TIMEOUT_S = 45  # long, so a restart that waited it out could not go unnoticed
RESUME_BOUND_S = 20.0
SCENARIO = "2. kill -9 x20 + restart"


@pytest.mark.parametrize(
    ("guarantee", "layout"),
    # CI runs the stricter guarantee (no duplicate either) with the default layout;
    # --all runs at-least-once, and exactly-once with one worker per level.
    [
        pytest.param("at-least-once", "shared", marks=pytest.mark.long),
        ("exactly-once", "shared"),
        pytest.param("exactly-once", "per-level", marks=pytest.mark.long),
    ],
)
def test_kill_9_then_restart_under_the_same_name_loses_nothing_and_resumes_at_once(
    fault_run, kafka_bootstrap, fault_summary, guarantee, layout
):
    """Exactly-once: the restarted instance's transactional id fences the killed one's
    open transaction, so a read_committed reader sees no duplicate either."""
    rng = random.Random(SEED)
    run = fault_run(kafka_bootstrap, guarantee=guarantee, level_workers=layout)
    target = run.target("kill9")
    run.fleet.extra_env["DELAYSERVICE_SESSION_TIMEOUT_S"] = str(SESSION_TIMEOUT_S)
    name = f"kill9-{run.testbed.tag}"
    daemon = run.fleet.spawn(name)
    run.wait_ready(daemon)
    run.traffic([target], rate=80, seed=SEED)
    time.sleep(2)

    kills: list[int] = []
    restarts: list[int] = []
    for _ in range(RESTARTS):
        # The kill lands at a seeded random moment of the daemon's own life: a process
        # still importing (longer than the shortest interval on a loaded host) holds
        # nothing to lose, and killing it chained restarts that could not forward.
        assert wait_until(daemon.serving, timeout=60), daemon.log_tail()
        time.sleep(rng.uniform(0.3, 3.5))
        daemon.kill()
        kills.append(now_ms())
        daemon = run.fleet.spawn(name)
        restarts.append(daemon.started_ms)
        run.assert_alive()
    time.sleep(5)  # traffic goes on after the last restart

    report = run.drain(
        scenario_name(SCENARIO, guarantee, layout),
        timeout=60,
    )
    resumed = recovery_s(report, restarts)
    windows = list(zip(restarts, [*kills[1:], math.inf], strict=True))
    # Records produced after a restart and due before the next kill: what a restarted
    # daemon alone was responsible for.
    after_restart = report.lateness_where(
        lambda s: (
            s.due_ms is not None
            and any(start <= s.rec.ts and s.due_ms < end for start, end in windows)
        )
    )
    known = [r for r in resumed if r is not None]
    report.recovery_s = max(known, default=None)
    report.notes += [
        f"p99 lateness of records produced after a restart: "
        f"{percentile(after_restart, 0.99) or 0:.2f} s (target ≤ 2 s)",
        f"median resume {sorted(known)[len(known) // 2] if known else 0:.2f} s",
        f"session timeout {SESSION_TIMEOUT_S} s",
    ]
    fault_summary(report)

    run.assert_alive()
    assert not report.lost, report.problems()
    assert not report.early, report.problems()
    assert not report.wrong, report.problems()
    if guarantee == "exactly-once":
        assert report.duplicates == 0, report.problems()
    slow = [(i, r) for i, r in enumerate(resumed) if r is None or r > RESUME_BOUND_S]
    assert not slow, f"restarts (index, seconds) that did not resume in {RESUME_BOUND_S}s: {slow}"
