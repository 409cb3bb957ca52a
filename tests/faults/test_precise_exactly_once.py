"""Scenario 25: precise mode with guarantee = exactly-once under a broker restart.

What a read_committed reader of the target sees is judged (the harness reads
read_committed): 0 lost, 0 early, 0 duplicates, 0 cancels leaked. The precise topic's
offsets commit when a record is on disk, so what keeps a record from going twice is
the done topic's record of each transaction (`precise.delivery_log`): a producer
replaced after an unknown outcome (or a restarted daemon's) fences the one before under
the same transactional id, reads what committed and settles those records unsent.
Messages are cancelled before and after the outage, so cancels race the fault. The
other precise rows run exactly-once too (kill -9 twenty times, cancels then kill -9,
reschedules then kill -9, partitions added, the burst then kill -9): they are
parametrized by guarantee where they live.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

import pytest

from tests.faults.harness import scenario_name
from tests.faults.test_precise_faults import Canceller, _precise_run, _verdict

if TYPE_CHECKING:
    from tests.faults.conftest import FaultRun
    from tests.faults.measure import Report

pytestmark = pytest.mark.kafka

SEED = 2_424
CANCELS_PER_ROUND = 3
CANCEL_DELAY_S = (8.0, 12.0)
"""Messages cancelled are due this long after they are sent; each cancel is
acknowledged seconds before its message is due, whatever kill comes next."""


def _cancel_some(canceller: Canceller, target: str, rng: random.Random) -> None:
    doomed = canceller.send(
        target, [rng.uniform(*CANCEL_DELAY_S) for _ in range(CANCELS_PER_ROUND)], rng
    )
    canceller.cancel(doomed)


def _exactly_once(run: FaultRun, report: Report, fault_summary: Any) -> None:
    _verdict(run, report, fault_summary)
    assert report.duplicates == 0, report.problems()


OUTAGE_S = 5.0


@pytest.mark.long
def test_precise_exactly_once_broker_restart_delivers_each_message_once(
    own_broker, fault_run, fault_summary, tmp_path, testbed
):
    """Transactions open when the broker died are aborted, or their outcome is unknown
    and the producer is replaced: what committed is learned, the rest goes again."""
    rng = random.Random(SEED + 1)
    run = _precise_run(
        fault_run,
        own_broker.bootstrap,
        testbed,
        "eobroker",
        levels="1s",
        data_dir=tmp_path / "wheel",
        guarantee="exactly-once",
    )
    target = run.target("peobroker")
    daemon = run.fleet.spawn(f"peobroker-{run.testbed.tag}")
    run.wait_ready(daemon)
    run.traffic([target], rate=80, seed=SEED + 1, precision="exact")
    canceller = Canceller(run)
    _cancel_some(canceller, target, rng)
    time.sleep(5)
    own_broker.kill()
    time.sleep(OUTAGE_S)  # holding the outage; records fall due meanwhile
    own_broker.restart()
    time.sleep(8)
    _cancel_some(canceller, target, rng)
    canceller.wait_past_due()
    report = run.drain(scenario_name("25. precise: broker restart", "exactly-once"), timeout=90)
    report.notes.append(f"broker down {OUTAGE_S:.0f} s + restart, cancels before and after")
    _exactly_once(run, report, fault_summary)
