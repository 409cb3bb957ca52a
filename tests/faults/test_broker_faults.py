"""Scenarios 3 and 4: the broker crashes and restarts, or freezes (SIGSTOP) for longer
than the session timeout, while traffic goes on.

These need a broker of their own (`own_broker`, in conftest.py).
"""

from __future__ import annotations

import random
import time

import pytest

from tests.faults.harness import now_ms, scenario_name
from tests.faults.measure import recovery_s

pytestmark = pytest.mark.kafka

SEED = 31_337
OUTAGE_S = 5.0
FREEZE_S = 10.0
SESSION_TIMEOUT_S = 6  # the broker's minimum; the freeze outlasts it


def _run_with_traffic(
    own_broker, fault_run, session_timeout_s: int | None = None, guarantee: str = "at-least-once"
):
    run = fault_run(own_broker.bootstrap, guarantee=guarantee)
    if session_timeout_s is not None:
        run.fleet.extra_env["DELAYSERVICE_SESSION_TIMEOUT_S"] = str(session_timeout_s)
    target = run.target("broker")
    daemon = run.fleet.spawn(f"broker-{run.testbed.tag}")
    run.wait_ready(daemon)
    run.traffic([target], rate=60, seed=random.Random(SEED).randrange(10**6))
    time.sleep(5)
    return run


def _verdict(run, report, back_ms: int, fault_summary) -> None:
    report.recovery_s = recovery_s(report, [back_ms])[0]
    fault_summary(report)
    run.assert_alive()
    assert not report.lost, report.problems()
    assert not report.early, report.problems()
    assert not report.wrong, report.problems()
    assert report.recovery_s is not None, "nothing was forwarded after the fault"


@pytest.mark.parametrize(
    "guarantee",
    # CI runs the stricter of the two (no duplicate either); --all runs both.
    [pytest.param("at-least-once", marks=pytest.mark.long), "exactly-once"],
)
def test_broker_restart_under_traffic_loses_nothing(
    own_broker, fault_run, fault_summary, guarantee
):
    """Exactly-once: transactions open when the broker died are aborted and sent again."""
    # own_broker first: fixtures tear down in reverse, so the daemons stop before the broker.
    run = _run_with_traffic(own_broker, fault_run, guarantee=guarantee)
    own_broker.kill()
    time.sleep(OUTAGE_S)  # holding the outage; records fall due meanwhile
    own_broker.restart()
    back = now_ms()
    time.sleep(8)
    report = run.drain(scenario_name("3. broker restart", guarantee), timeout=60)
    report.notes.append(f"broker down {OUTAGE_S:.0f} s + restart")
    _verdict(run, report, back, fault_summary)
    if guarantee == "exactly-once":
        assert report.duplicates == 0, report.problems()


@pytest.mark.long
def test_broker_frozen_past_the_session_timeout_loses_nothing(own_broker, fault_run, fault_summary):
    run = _run_with_traffic(own_broker, fault_run, SESSION_TIMEOUT_S)
    own_broker.freeze()
    try:
        time.sleep(FREEZE_S)  # holding the freeze
    finally:
        own_broker.thaw()
    thawed = now_ms()
    time.sleep(10)
    report = run.drain("4. broker SIGSTOP", timeout=60)
    report.notes.append(f"frozen {FREEZE_S:.0f} s, session {SESSION_TIMEOUT_S} s")
    _verdict(run, report, thawed, fault_summary)
