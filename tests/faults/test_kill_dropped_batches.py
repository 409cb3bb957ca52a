"""Scenario 33: kill -9 while the consumer's reads drop what they fetched.

A librdkafka log line that fails on the consumer's thread makes `consume()` drop the
batch it fetched, and the client has moved past it (`tests/kafka/
test_consume_callback_failure.py`). The daemon seeks back after every failed turn, so
in one process life every record arrives; what a kill -9 adds is the restart, which
starts from the committed offsets alone. A commit that ever passed a dropped record
loses it here, where the in-process rows would not see it: the seek back reads it in
that life whatever was committed. The lines fail from a `sitecustomize` on the
daemon's `PYTHONPATH` (`failing_lines/`), in every life of the daemon.

The last daemon's stop runs out its `shutdown_timeout_s` and exits 1: after a failed
consume() librdkafka could not destroy the client (its broker thread kept a reference,
`rd_kafka_destroy` waited on it). Nothing is lost by it (docs/faults.md, scenario 33),
and the row says so in its notes rather than failing on it.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from tests.faults.harness import scenario_name, wait_until

pytestmark = pytest.mark.kafka

SEED = 3_301
RESTARTS = 5
SCENARIO = "33. kill -9 while reads drop batches"
HOOK_DIR = Path(__file__).parent / "failing_lines"
FAILED_LINE = "a logging filter failed"


@pytest.mark.parametrize(
    "guarantee",
    [pytest.param("at-least-once", marks=pytest.mark.long), "exactly-once"],
)
def test_kill_9_while_reads_drop_their_batches_loses_nothing(
    fault_run, kafka_bootstrap, fault_summary, guarantee
):
    rng = random.Random(SEED)
    run = fault_run(kafka_bootstrap, guarantee=guarantee, consumer={"debug": "fetch"})
    run.fleet.extra_env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(HOOK_DIR), os.environ.get("PYTHONPATH")) if p),
        DELAYSERVICE_TEST_FAIL_LINES="consumer-",
    )
    target = run.target("dropped-kill9")
    name = f"dropped-kill9-{run.testbed.tag}"
    daemon = run.fleet.spawn(name)
    run.wait_ready(daemon)
    run.traffic([target], rate=80, seed=SEED)
    for _ in range(RESTARTS):
        assert wait_until(daemon.serving, timeout=60), daemon.log_tail()
        time.sleep(rng.uniform(3.5, 6.0))  # lines fail from 3 s into each life
        daemon.kill()
        daemon = run.fleet.spawn(name)
        run.assert_alive()
    time.sleep(5)  # traffic goes on after the last restart

    report = run.drain(scenario_name(SCENARIO, guarantee), timeout=90)
    failed = sum(Path(log).read_text(errors="replace").count(FAILED_LINE) for log in report.logs)
    report.notes.append(f"consumer turns that failed, as the logs show: {failed}")
    fault_summary(report)

    run.assert_alive()
    assert failed >= RESTARTS, f"only {failed} failed turns logged: the fault never opened"
    assert not report.lost, report.problems()
    assert not report.early, report.problems()
    assert not report.wrong, report.problems()
    if guarantee == "exactly-once":
        assert report.duplicates == 0, report.problems()
