"""Scenario 6: a target topic is deleted and re-created while records for it flow.

Records that fall due while the target is gone may be dead-lettered as unknown_topic:
that is the documented outcome, not loss. Records due well after it is back must be
forwarded to it, and the other target must not notice.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaException

from tests.faults.harness import now_ms, wait_until
from tests.faults.log_dirs import deleted_everywhere
from tests.faults.measure import recovery_s

pytestmark = pytest.mark.kafka

SEED = 6_006
GAP_S = 4.0
GRACE_MS = 10_000  # after re-creation, how long the daemon may still think it is gone
SCENARIO = "6. target deleted + re-created"
GAP_REASONS = {b"unknown_topic", b"unknown_partition"}


def test_a_target_deleted_and_recreated_mid_run_loses_nothing(
    fault_run, kafka_bootstrap, fault_summary
):
    run = fault_run(kafka_bootstrap)
    stable = run.target("stays")
    moving = run.target("moves")
    admin = run.testbed.admin
    daemon = run.fleet.spawn(f"recreate-{run.testbed.tag}")
    run.wait_ready(daemon)
    traffic = run.traffic([stable, moving], rate=60, seed=SEED)
    time.sleep(4)

    # Read everything the first incarnation will ever hold before deleting it.
    traffic.set_targets([stable])
    reader = run.read()

    def moving_settled() -> bool:
        reader.catch_up()
        report = run.evaluate(SCENARIO)
        return all(s.deliveries or s.dead for s in report.sources if s.expect.target == moving)

    run.testbed.wait_for(moving_settled, 30, f"every record for {moving} to arrive")
    reader.remove(moving)
    reader.rename(moving, f"{moving} (deleted)")
    admin.delete_topics([moving])[moving].result(30)
    run.testbed.wait_for(lambda: deleted_everywhere(admin, moving), 30, f"{moving} to go")
    deleted = now_ms()
    traffic.set_targets([stable, moving])
    time.sleep(GAP_S)  # holding the gap; records for the missing target fall due

    def recreate() -> bool:
        try:
            run.testbed.create_topic(moving, 3, {"message.timestamp.type": "LogAppendTime"})
        except KafkaException:
            return False  # still marked for deletion
        return True

    assert wait_until(recreate, 30, interval=0.5), f"{moving} could not be re-created"
    recreated = now_ms()
    reader.add([moving])
    time.sleep(12)

    def in_the_gap(source) -> bool:
        due = source.due_ms
        return (
            source.expect.target == moving
            and due is not None
            and deleted <= due <= recreated + GRACE_MS
            and all(letter.header("dlq-reason") in GAP_REASONS for letter in source.dead)
        )

    report = run.drain(SCENARIO, timeout=90, may_dead_letter=in_the_gap)
    report.recovery_s = recovery_s(report, [recreated], group=lambda s: s.expect.target)[0]
    report.notes.append(f"gap {GAP_S:.0f} s; recovery = first forward to the re-created target")
    fault_summary(report)

    run.assert_alive()
    assert not report.lost, report.problems()
    assert not report.early, report.problems()
    assert not report.wrong, report.problems()
    assert report.recovery_s is not None, f"nothing reached the re-created {moving}"
