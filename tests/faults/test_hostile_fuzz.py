"""Scenario 1: a few thousand hostile records interleaved with good traffic on every level.

Invariant 7: nothing one record does stops the service. Any header bytes, any target
name, any size: each record is forwarded on time or dead-lettered with a reason and
its origin, and the good records around it keep arriving on time. Hostile cancel and
reschedule markers go to the markers topic meanwhile: each one no daemon can act on is
answered `refused` or `unmatched` with its reason, and a valid one among them (for a
good record) acts as any other.
"""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest
from confluent_kafka import KafkaException, Producer

from delayservice.producer import DelayProducer
from tests.faults.hostile import FuzzTopics, HostileFactory, hostile_marker
from tests.faults.measure import percentile
from tests.faults.test_level_markers_faults import answers

pytestmark = pytest.mark.kafka

SEED = 20_251_121
HOSTILE = 3000
GOOD = 1200
MARKERS = 400
RATE = 180.0  # records per second, so production takes about 25 s
GIVE_UP_S = 15  # a record failing for this long is dead-lettered (retries_exhausted)
GOOD_LATENESS_BOUND_S = 15.0
SCENARIO = "1. hostile fuzz"


def test_hostile_records_are_forwarded_on_time_or_dead_lettered_and_good_ones_flow(
    fault_run, kafka_bootstrap, fault_summary
):
    rng = random.Random(SEED)
    run = fault_run(kafka_bootstrap)
    targets = [run.target("fuzz-a"), run.target("fuzz-b")]
    run.fleet.extra_env["DELAYSERVICE_RETRY_GIVE_UP_S"] = str(GIVE_UP_S)
    daemon = run.fleet.spawn(f"fuzz-{run.testbed.tag}")
    run.wait_ready(daemon)

    levels = [(level.topic, level.delay_ms) for level in run.settings.level_set()]
    factory = HostileFactory(
        rng,
        FuzzTopics(
            levels,
            run.settings.partitions,
            targets,
            3,
            run.settings.dead_letter_topic,
            f"missing-{run.testbed.tag}",
        ),
    )
    hostile = Producer(
        {"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True, "linger.ms": 5}
    )
    good = DelayProducer(
        {"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True, "linger.ms": 5},
        settings=run.settings,
    )
    refused: Counter[str] = Counter()
    good_ids: list[str] = []
    must_answer: dict[bytes, str] = {}

    def marker_landed(answer: str | None):
        def landed(err, msg) -> None:
            if err is None and answer is not None:
                must_answer[f"{msg.topic()}:{msg.partition()}:{msg.offset()}".encode()] = answer

        return landed

    started = time.monotonic()
    for i in range(HOSTILE + GOOD):
        index = i % len(levels)
        if rng.random() < MARKERS / (HOSTILE + GOOD):
            headers, answer = hostile_marker(rng, len(levels), run.settings.partitions, good_ids)
            hostile.produce(
                run.settings.markers_topic, rng.choice([None, b"", b"v"]), None,
                headers=headers, on_delivery=marker_landed(answer),
            )  # fmt: skip
        if rng.random() < GOOD / (HOSTILE + GOOD):
            low = levels[index - 1][1] if index else 0
            good_ids.append(
                good.produce(
                    rng.choice(targets),
                    rng.randbytes(rng.randint(1, 300)),
                    f"good-{rng.randrange(100)}".encode(),
                    delay=rng.randint(low + 1, levels[index][1]) / 1000,
                    on_delivery=run.sent.callback(good=True),
                )
            )
        else:
            partition, key, value, headers = factory.record(index)
            try:
                hostile.produce(
                    levels[index][0],
                    value,
                    key,
                    partition=partition,
                    headers=headers,
                    on_delivery=run.sent.callback(good=False),
                )
            except (KafkaException, BufferError, ValueError, TypeError) as exc:
                refused[type(exc).__name__] += 1  # too big for any broker: never sent
        hostile.poll(0)
        good.poll(0)
        pause = started + i / RATE - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # pacing the traffic
    assert hostile.flush(60) == 0
    assert good.flush(60) == 0
    del hostile, good  # their clients go now, not when the broker is long gone

    report = run.drain(SCENARIO, timeout=GIVE_UP_S + 30)
    got = answers(kafka_bootstrap, run.settings.markers_outcomes_topic)
    wrong_answers = [
        (key[-20:], want, got.get(key, {}).get("outcome"))
        for key, want in must_answer.items()
        if got.get(key, {}).get("outcome") != want
    ]
    good_late = report.lateness_where(lambda s: s.good)
    good_missing = [s.where() for s in report.ours if s.good and not s.deliveries]
    reasons = ", ".join(f"{r or '(empty)'} {n}" for r, n in report.dead_reasons.most_common())
    level_ms = dict(levels)
    held_longer = sum(
        1 for s in report.ours if s.deliveries and s.expect.delay_ms > level_ms[s.rec.topic]
    )
    report.notes += [
        f"{sum(1 for s in report.ours if not s.good)} hostile",
        f"{held_longer} forwarded with delay-ms above their level",
        f"good p99 {percentile(good_late, 0.99) or 0:.2f} s",
        f"dead letters: {reasons}",
        f"{report.stubs} payload-free dead-letter stubs",
        f"{len(must_answer)} hostile markers answered as they must be: "
        f"{len(must_answer) - len(wrong_answers)}; {len(report.cancelled)} good cancelled",
    ]
    if refused:
        report.notes.append(f"refused by the test's producer: {dict(refused)}")
    fault_summary(report)

    run.assert_alive()
    assert not report.lost, report.problems()
    assert not report.early, report.problems()
    assert not report.wrong, report.problems()
    assert not good_missing, f"{len(good_missing)} good records not forwarded: {good_missing[:5]}"
    assert not report.cancels_leaked, report.problems()
    assert not wrong_answers, f"markers answered otherwise than they must be: {wrong_answers[:5]}"
    assert max(good_late, default=0) <= GOOD_LATENESS_BOUND_S, (
        f"good records up to {max(good_late):.1f}s late"
    )
