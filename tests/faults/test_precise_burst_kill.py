"""Scenario 23: precise mode killed with kill -9 a second after a burst, restarted at once.

Issue 35's report: 1,500 exact messages due in 0.35-12.7 s, 10 of them cancelled, then
1,500 more due in 3-9 s; the daemon is killed one second after the last flush and
started again at once on the same data directory. A kill right after a burst finds
records sent but not yet settled, and may find records read, written and synced whose
offsets the intake's commits (asynchronous) have not yet carried to the broker: in the
issue's runs both bursts were still uncommitted at the kill (here they were committed
in each of five plain runs). The scenario makes sure of that worst case: while the
daemon is down, the intake's committed offsets are set back to where they were before
the bursts, so by the broker's word every record of them is unread, and all of them
are on disk. A record read twice must be delivered once; a record sent before the
kill may go twice only if it was sent within the last report interval: the commit
interval plus the flush that ends it (docs/precise-mode.md, "Once, and again only for
what was sent in the last report interval"). The read-back counts every copy per
`delay-id` once the daemon has stopped and every partition was read to its end.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition

from delayservice.precise.precise_worker import precise_group_id
from tests.faults.harness import now_ms
from tests.faults.test_precise_faults import Canceller, _precise_run, _verdict

if TYPE_CHECKING:
    from tests.faults.conftest import FaultRun
    from tests.faults.measure import Report

pytestmark = pytest.mark.kafka

SEED = 3_535
BURST = 1_500
FIRST_DELAYS_S = (0.35, 12.7)
SECOND_DELAYS_S = (3.0, 9.0)
CANCELS = 10
CANCEL_AT_LEAST_S = 8.0
"""Only messages due this long after their burst are cancelled: their cancel is read
long before they are due, so none may arrive."""
KILL_AFTER_S = 1.0
COMMIT_INTERVAL_S = 0.5  # the fault suite's (`harness.Fleet.env`)
FLUSH_ALLOWANCE_S = 0.5
"""What the bound allows for the flush that ends a commit interval."""
WINDOW_MS = int((COMMIT_INTERVAL_S + FLUSH_ALLOWANCE_S) * 1000)


def end_offsets(run: FaultRun) -> dict[int, int]:
    """The precise topic's end offset per partition."""
    topic = run.settings.precise_topic
    consumer = Consumer({"bootstrap.servers": run.bootstrap, "group.id": f"ends-{run.testbed.tag}"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(run.settings.partitions)
        }
    finally:
        consumer.close()


def set_back_commits(run: FaultRun, offsets: dict[int, int]) -> None:
    """Set the intake's committed offsets of the precise topic to `offsets`, as if its
    commits since had not reached the broker (the daemon must be down)."""
    topic = run.settings.precise_topic
    group = precise_group_id(run.settings, run.settings.precise_member)
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(topic, p, offset) for p, offset in sorted(offsets.items())]
    )
    for future in run.testbed.admin.alter_consumer_group_offsets([request]).values():
        future.result(30)


def sent_again_outside(report: Report, kill_ms: int, restart_ms: int) -> list[str]:
    """Sources delivered more than once that the bound does not excuse: first sent more
    than `WINDOW_MS` before the kill or by the restarted daemon (a record read twice),
    or sent three times or more (one kill repeats a record once at most). A copy the
    killed daemon had on its way may reach the broker just after the kill."""
    out = []
    for source in report.sources:
        copies = sorted(d.ts for d in source.deliveries)
        if len(copies) < 2:
            continue
        if len(copies) > 2 or not kill_ms - WINDOW_MS <= copies[0] < restart_ms:
            where = ", ".join(f"{ts - kill_ms:+d} ms" for ts in copies)
            out.append(f"{source.where()} {source.expect.id}: copies at {where} from the kill")
    return out


@pytest.mark.parametrize(
    "guarantee", [pytest.param("at-least-once", marks=pytest.mark.long), "exactly-once"]
)
def test_precise_burst_then_kill_9_within_a_second_sends_again_only_the_last_interval(
    fault_run, kafka_bootstrap, fault_summary, tmp_path, testbed, guarantee
):
    """Exactly-once, a read_committed reader sees no duplicate at all: what the killed
    daemon's last transactions committed is learned from the done topic."""
    rng = random.Random(SEED)
    run = _precise_run(
        fault_run,
        kafka_bootstrap,
        testbed,
        "burst",
        levels="1s",
        data_dir=tmp_path / "wheel",
        guarantee=guarantee,
    )
    target = run.target("pburst")
    name = f"pburst-{run.testbed.tag}"
    daemon = run.fleet.spawn(name)
    run.wait_ready(daemon)
    before_bursts = end_offsets(run)
    canceller = Canceller(run)
    sent = canceller.send(target, [rng.uniform(*FIRST_DELAYS_S) for _ in range(BURST)], rng)
    started = time.monotonic()
    late = [mid for mid in sent if canceller.dues[mid] - started >= CANCEL_AT_LEAST_S]
    canceller.cancel(rng.sample(late, CANCELS))
    canceller.send(target, [rng.uniform(*SECOND_DELAYS_S) for _ in range(BURST)], rng)
    time.sleep(KILL_AFTER_S)  # the fault's timing, not a wait for a condition
    kill_ms = now_ms()
    daemon.kill()
    set_back_commits(run, before_bursts)
    restart_ms = now_ms()
    daemon = run.fleet.spawn(name)
    run.wait_ready(daemon)
    canceller.wait_past_due()
    scenario = f"23. precise: burst, kill -9 {KILL_AFTER_S:g} s after"
    if guarantee == "exactly-once":
        scenario += " (exactly-once)"
    report = run.drain(scenario, timeout=90)
    run.assert_alive()
    # Every copy counts: stop the daemon, then read every partition to its end.
    run.fleet.stop_all()
    assert run.read().catch_up(), "the read-back did not reach the end of every partition"
    report = run.evaluate(scenario)

    firsts = [d.ts for s in report.sources if (d := s.first_delivery) is not None]
    before_kill = sum(ts < restart_ms for ts in firsts)
    in_window = sum(kill_ms - WINDOW_MS <= ts < restart_ms for ts in firsts)
    allowed = 0 if guarantee == "exactly-once" else in_window
    again = [
        min(d.ts for d in s.deliveries) - kill_ms for s in report.sources if len(s.deliveries) > 1
    ]
    report.notes.append(
        f"{2 * BURST} sent in two bursts, {CANCELS} cancelled; committed offsets set back "
        f"to before the bursts during the outage; {before_kill} forwarded before the kill, "
        f"{in_window} in its last {WINDOW_MS} ms (the bound: at most {allowed} duplicates)"
        + (
            f"; those sent again were first sent {min(again):+d} to {max(again):+d} ms from it"
            if again
            else ""
        )
    )
    _verdict(run, report, fault_summary)
    assert len(report.cancelled) == CANCELS
    outside = sent_again_outside(report, kill_ms, restart_ms)
    assert not outside, f"{len(outside)} sent again outside the bound:\n" + "\n".join(outside[:10])
    assert report.duplicates <= allowed, report.problems()
