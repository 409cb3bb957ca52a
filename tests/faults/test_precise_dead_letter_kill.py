"""Scenario 32: precise mode's dead letters under kill -9, each one once.

Good exact messages are mixed with hostile records (`hostile.HostileFactory`), many of
which the intake dead-letters at once. Exactly-once, such a dead letter goes out in a
transaction, and the intake commits its offset only after that transaction: a kill in
between leaves a record the next process reads again. The delivery records name it
until the intake has committed past it (`precise/delivery/delivery_log.py`), so the
restarted daemon settles it unsent (`precise/wheel/slot_taking.py`) and a
read_committed reader of the dead-letter topic finds one dead letter per record
(docs/precise-mode.md). Some kills wait for a transaction to commit dead letters of the
records just sent, then strike at once; the others strike while hostile records stream
in. A targeted kill that finds no dead letter left to read again is followed by
another, up to `TRIES` a round.

Each kill's window is measured from the broker, not from the daemon: the dead letters
committed before it whose origin the intake had not yet committed past are the ones
its successor reads again (`exposed`); with none in any round the row would measure
nothing.
"""

from __future__ import annotations

import contextlib
import random
import time
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from delayservice.precise.precise_worker import precise_group_id
from tests.faults.harness import Reader, Rec, now_ms, scenario_name, wait_until
from tests.faults.hostile import FuzzTopics, HostileFactory
from tests.faults.measure import dead_letter_origin
from tests.faults.test_precise_faults import _precise_run, _verdict

if TYPE_CHECKING:
    from tests.faults.conftest import FaultRun

pytestmark = pytest.mark.kafka

SEED = 3_232
ROUNDS = 5
STREAM = 60
"""Hostile records per round, sent over `STREAM_S` while good traffic goes on."""
STREAM_S = 3.0
LAST = 10
"""Hostile records sent just before a kill that waits for their dead letters."""
TRIES = 3
"""Kills a targeted round may take to find dead letters the intake has not committed
past: the window is tens of milliseconds between a transaction and the intake's next
commit."""
DEAD_LETTER_WAIT_S = 15.0
GOOD_RATE = 10
"""Good messages a second: a gap in them lets the intake wait up to its poll timeout
before it commits, which widens the window a kill is to find."""


class HostileStream:
    """Hostile records on the precise topic, as the test's own (not good) sources."""

    def __init__(self, run: FaultRun, targets: list[str], rng: random.Random) -> None:
        self.run = run
        self.rng = rng
        self.topic = run.settings.precise_topic
        self.factory = HostileFactory(
            rng,
            FuzzTopics(
                [(self.topic, 6000)],
                run.settings.partitions,
                targets,
                3,
                run.settings.dead_letter_topic,
                f"missing-{run.testbed.tag}",
            ),
        )
        self.producer = Producer({"bootstrap.servers": run.bootstrap, "linger.ms": 5})
        self.count = 0

    def send(self, count: int, over_s: float = 0.0) -> set[tuple[str, int, int]]:
        """`count` records spread over `over_s`; returns the positions acknowledged."""
        acked: set[tuple[str, int, int]] = set()
        logged = self.run.sent.callback(good=False)

        def on_delivery(err: Any, msg: Any) -> None:
            logged(err, msg)
            if err is None:
                acked.add((msg.topic(), msg.partition(), msg.offset()))

        for _ in range(count):
            partition, key, value, headers = self.factory.record(0)
            # Too big for any broker: never sent.
            with contextlib.suppress(KafkaException, BufferError, ValueError, TypeError):
                self.producer.produce(
                    self.topic,
                    value,
                    key,
                    partition=partition,
                    headers=headers,
                    on_delivery=on_delivery,
                )
                self.count += 1
            self.producer.poll(0)
            time.sleep(over_s / count)  # pacing: a stream, not a burst
        assert self.producer.flush(30) == 0
        return acked


def committed_offsets(run: FaultRun) -> dict[int, int]:
    """The intake's committed offsets of the precise topic (-1: none yet)."""
    topic = run.settings.precise_topic
    group = precise_group_id(run.settings, run.settings.precise_member)
    consumer = Consumer({"bootstrap.servers": run.bootstrap, "group.id": group})
    try:
        asked = [TopicPartition(topic, p) for p in range(run.settings.partitions)]
        return {tp.partition: tp.offset for tp in consumer.committed(asked, timeout=15)}
    finally:
        consumer.close()


def exposed(
    letters: list[Rec], topic: str, kill_ms: int, committed: dict[int, int]
) -> set[tuple[int, int]]:
    """Records dead-lettered (and committed) before a kill that the intake had not
    committed past: the next process reads them again."""
    out = set()
    for rec in letters:
        origin = dead_letter_origin(rec)
        made_ms = int(rec.header("dlq-time-ms") or 0)
        if origin is None or origin[0] != topic or made_ms >= kill_ms:
            continue
        if origin[2] >= committed.get(origin[1], -1):
            out.add(origin[1:])
    return out


class CommittedEnd:
    """The dead-letter topic's end as a read_committed reader sees it (the last stable
    offset exactly-once), asked of the broker each time: it moves the moment a
    transaction with dead letters commits, sooner than reading the records would show."""

    def __init__(self, run: FaultRun) -> None:
        self.topic = run.settings.dead_letter_topic
        self.partitions = run.settings.partitions
        self.consumer = Consumer(
            {
                "bootstrap.servers": run.bootstrap,
                "group.id": f"dlq-end-{run.testbed.tag}",
                "isolation.level": "read_committed",
            }
        )

    def __call__(self) -> int:
        return sum(
            self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), 5, False)[1]
            for p in range(self.partitions)
        )

    def close(self) -> None:
        self.consumer.close()


@pytest.mark.long  # 65-90 s a run; CI's exactly-once dead letters stay with the simulation
@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_precise_dead_letters_once_across_kill_9(
    fault_run, kafka_bootstrap, fault_summary, tmp_path, testbed, guarantee
):
    """Exactly-once: every record dead-lettered once for a read_committed reader, every
    good message once on its target, across five kills. At-least-once the dead letters
    repeated are counted, not refused."""
    rng = random.Random(SEED)
    run = _precise_run(
        fault_run,
        kafka_bootstrap,
        testbed,
        "dlqkill",
        levels="1s,5s",
        data_dir=tmp_path / "wheel",
        max_delay="1m",
        guarantee=guarantee,
    )
    targets = [run.target("pdlq-a"), run.target("pdlq-b")]
    run.fleet.extra_env["DELAYSERVICE_RETRY_GIVE_UP_S"] = "15"  # a missing target's
    name = f"pdlq-{run.testbed.tag}"
    daemon = run.fleet.spawn(name)
    run.wait_ready(daemon)
    end = CommittedEnd(run)
    watch_topic = run.settings.dead_letter_topic
    watch = Reader(kafka_bootstrap, [watch_topic])
    topic = run.settings.precise_topic
    per_kill: list[int] = []
    targeted: list[int] = []  # per targeted round: the dead letters its kills left
    try:
        run.traffic(targets, rate=GOOD_RATE, seed=SEED, precision="exact")
        hostile = HostileStream(run, targets, rng)

        def kill_and_restart() -> int:
            """Kill, note the intake's commits, restart; returns the dead letters
            the restarted daemon reads again."""
            nonlocal daemon
            kill_ms = now_ms()
            daemon.kill()
            committed = committed_offsets(run)
            daemon = run.fleet.spawn(name)
            watch.catch_up()  # up to the last stable offset: what committed before the kill
            per_kill.append(len(exposed(watch.records[watch_topic], topic, kill_ms, committed)))
            run.wait_ready(daemon)
            return per_kill[-1]

        for round_ in range(ROUNDS):
            hostile.send(STREAM, over_s=STREAM_S)
            if round_ % 2:
                kill_and_restart()  # while the stream was just flowing
                continue
            left = 0
            for _ in range(TRIES):  # strike the moment a transaction commits dead letters
                before = end()
                hostile.send(LAST)
                moved = lambda before=before: end() > before  # noqa: E731
                assert wait_until(moved, DEAD_LETTER_WAIT_S, 0.005), "no dead letter committed"
                if (left := kill_and_restart()) > 0:
                    break
            targeted.append(left)
    finally:
        end.close()
        watch.close()
    # The drain waits for every record, hostile ones to their dead letters: the last
    # round's due ones too.
    report = run.drain(
        scenario_name("32. precise: dead letters, kill -9 + restart", guarantee), timeout=90
    )
    reasons = ", ".join(f"{r or '(empty)'} {n}" for r, n in report.dead_reasons.most_common(4))
    report.notes += [
        f"{hostile.count} hostile",
        f"{len(per_kill)} kills, dead letters read again after each: {per_kill}",
        f"{sum(map(bool, targeted))} of {len(targeted)} rounds that struck the moment dead "
        f"letters committed (up to {TRIES} kills each) left some to read again",
        f"dead letters: {reasons}",
    ]
    repeated = report.dead_letters_repeated  # the row names them only when there are some
    print(f"\n{report.scenario}: {repeated} dead letters repeated; " + "; ".join(report.notes))
    _verdict(run, report, fault_summary)
    assert report.dead_lettered > 0
    if guarantee == "exactly-once":
        assert report.dead_letters_repeated == 0, report.problems()
        assert report.duplicates == 0, report.problems()
    assert sum(per_kill) > 0, "no kill left a dead letter to read again: nothing was tested"
