"""Scenario 31: a flood of cancel markers on one markers partition, with a kill -9 while
the daemon reads it.

A client writes well-formed cancels for messages that do not exist (`flood`), every one
of them on the markers partition of level partition 0, while an application sends
1,000 level messages over every partition, cancels a tenth and moves a twentieth. The
daemon is killed while the flood is still coming and started again: it reads the
flood again from the start of its window (nothing of the markers is committed).
Whatever the flood does, every promise holds: 0 lost, 0 early, 0 cancels leaked, 0 at
a replaced time, exactly-once 0 duplicates, and every real marker answered as the
broker's record of it calls for. The lateness of the
messages behind the flood and of the others is reported apart (not judged: it is a
benchmark's figure, `benchmarks/marker_flood.py`).
"""

from __future__ import annotations

import random
import time

import pytest

from delayservice.markers.level_ids import level_place
from tests.faults.flood import Flood
from tests.faults.harness import scenario_name
from tests.faults.measure import Source, percentile
from tests.faults.test_level_markers_faults import (
    ALO,
    DECISIONS,
    EOS,
    LEVELS,
    MESSAGES,
    _producer,
    judge,
    send_markers,
    send_messages,
)

pytestmark = pytest.mark.kafka

SEED = 3_131
FLOODED = 0  # the level partition every flood id names


def _flooded(source: Source) -> bool:
    place = level_place(source.expect.id)
    return place is not None and place.partition == FLOODED


def _lateness(values: list[float]) -> str:
    if not values:
        return "none"
    return f"p99 {percentile(values, 0.99):.2f} s, max {max(values):.2f} s ({len(values)})"


@pytest.mark.parametrize(
    ("guarantee", "flood"),
    [
        (EOS, 100_000),
        pytest.param(ALO, 100_000, marks=pytest.mark.long),
        pytest.param(ALO, 1_000_000, marks=pytest.mark.long),
        pytest.param(EOS, 1_000_000, marks=pytest.mark.long),
    ],
)
def test_a_flood_of_markers_with_a_kill_9_mid_flood_breaks_no_promise(
    fault_run, kafka_bootstrap, fault_summary, guarantee, flood
):
    rng = random.Random(SEED)
    run = fault_run(
        kafka_bootstrap, guarantee=guarantee, levels=LEVELS, cancel_lead="1s", log_level=DECISIONS
    )
    target = run.target("lflood")
    name = f"lflood-{run.testbed.tag}"
    daemon = run.fleet.spawn(name)
    run.wait_ready(daemon)
    flooding = Flood(run.settings, flood, only=FLOODED)
    writer = flooding.start()
    producer = _producer(kafka_bootstrap, run.settings)
    lead_s = run.settings.cancel_lead_ms / 1000
    marked = send_messages(producer, target, run.sent, rng, MESSAGES, lead_s)
    send_markers(producer, marked, rng)
    marked.landed()  # every real marker acknowledged before the kill
    producer.close()
    time.sleep(rng.uniform(0.2, 1.5))  # between the markers and the first due time
    at_kill = flooding.written
    daemon.kill()
    daemon = run.fleet.spawn(name)
    respawned = time.monotonic()
    run.wait_ready(daemon, timeout=120)
    ready_s = time.monotonic() - respawned
    writer.join(600)
    assert not writer.is_alive(), "the flood was not written in 600 s"
    assert flooding.error is None, f"the flood writer failed: {flooding.error!r}"
    assert flooding.written == flood
    scenario = f"31. level markers: kill -9 in a flood of {flood:,}"
    # A million markers on one partition take minutes to read after the restart, and
    # its records wait for them (late, not lost): nothing arrives meanwhile.
    big = flood > 100_000
    report = run.drain(
        scenario_name(scenario, guarantee), timeout=1200 if big else 300, stall_s=600 if big else 90
    )
    report.notes.append(
        f"flood written in {flooding.seconds:.1f} s, {at_kill:,} of it at the kill; "
        f"ready {ready_s:.1f} s after the restart; "
        f"late behind the flood: {_lateness(report.lateness_where(_flooded))}; "
        f"elsewhere: {_lateness(report.lateness_where(lambda s: not _flooded(s)))}"
    )
    judge(run, report, marked, guarantee, fault_summary)
