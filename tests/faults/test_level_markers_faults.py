"""Scenarios 27 to 29: cancel and reschedule of level messages under kill -9, behind a
backlog, beside group churn, and across a broker restart.

A cancel the broker acknowledged before its message's due time must be honoured: the
message never arrives, whatever happens to the daemon, and however far behind its
partition is. A reschedule moves the message to its new time (never earlier; at the
level that holds what is left), and it arrives once. The verdict comes from the
broker: the markers topic says which markers came in time (`measure`), the targets
what arrived, and the outcomes topic what the daemons answered.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from delayservice.producer import DelayProducer
from tests.faults.harness import Reader, SentLog, scenario_name
from tests.faults.measure import Report
from tests.faults.test_precise_faults import _verdict

pytestmark = pytest.mark.kafka

SEED = 3_434
LEVELS = "3s,6s,10s"
MESSAGES = 1_000
CANCEL_SHARE = 0.10
MOVE_SHARE = 0.05
DECISIONS = "DEBUG"
"""The daemons' log level in these rows: each marker decision is logged, and a failure
quotes the lines that name its messages (`answered_superseded`)."""
BACKLOG = 200_000
EOS = "exactly-once"
ALO = "at-least-once"


@dataclass
class Marked:
    """What the scenario sent: messages (id -> delay s) and the markers for them."""

    delays: dict[str, float] = field(default_factory=dict)
    cancels: list[str] = field(default_factory=list)
    moves: dict[str, float] = field(default_factory=dict)  # id -> new delay from its marker
    markers: list[Any] = field(default_factory=list)  # receipts

    def landed(self) -> list[tuple[str, int, int]]:
        return [receipt.landed(60) for receipt in self.markers]


def _producer(bootstrap: str, settings: Any, **config: Any) -> DelayProducer:
    return DelayProducer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True, **config},
        settings=settings,
    )


def send_messages(
    producer: DelayProducer,
    target: str,
    sent: SentLog,
    rng: random.Random,
    count: int,
    lead_s: float = 0.0,
) -> Marked:
    """Due in 3-10 s, or from 3 s past the lead: the markers, sent right after, must
    come the lead before the due times to be promised (a loaded host sends them seconds
    after the messages)."""
    marked = Marked()
    on_delivery = sent.callback(good=True)
    for number in range(count):
        delay = rng.uniform(3.0 + lead_s, 10.0)
        key = f"k{rng.randrange(200)}".encode()
        mid = producer.produce(target, f"m{number}".encode(), key, delay=delay,
                               on_delivery=on_delivery)  # fmt: skip
        marked.delays[mid] = delay
    assert producer.flush(60) == 0
    return marked


def send_markers(producer: DelayProducer, marked: Marked, rng: random.Random) -> None:
    """Cancel a tenth of the messages and move a twentieth (half earlier, half later),
    all while they wait."""
    ids = list(marked.delays)
    rng.shuffle(ids)
    cancels = ids[: int(len(ids) * CANCEL_SHARE)]
    moves = ids[len(cancels) : len(cancels) + int(len(ids) * MOVE_SHARE)]
    for mid in cancels:
        marked.markers.append(producer.cancel(mid))
        marked.cancels.append(mid)
    for index, mid in enumerate(moves):
        delay = marked.delays[mid]
        new = rng.uniform(0.5, 2.0) if index % 2 == 0 else rng.uniform(min(delay + 1, 9.5), 9.8)
        marked.markers.append(producer.reschedule(mid, delay=new))
        marked.moves[mid] = new
    assert producer.flush(60) == 0


def answers(bootstrap: str, outcomes_topic: str) -> dict[bytes, dict[str, Any]]:
    """The first answer to each marker on the outcomes topic (read_committed)."""
    return {key: found[0] for key, found in every_answer(bootstrap, outcomes_topic).items()}


def every_answer(bootstrap: str, outcomes_topic: str) -> dict[bytes, list[dict[str, Any]]]:
    """Every answer to each marker on the outcomes topic (read_committed), in order,
    with where it stands (`at`, `ts`)."""
    reader = Reader(bootstrap, [outcomes_topic])
    try:
        assert reader.catch_up(60)
        out: dict[bytes, list[dict[str, Any]]] = {}
        for rec in reader.records[outcomes_topic]:
            if rec.key is not None and rec.value is not None:
                answer = {**json.loads(rec.value), "at": rec.offset, "ts": rec.ts}
                out.setdefault(rec.key, []).append(answer)
        return out
    finally:
        reader.close()


def answered_twice(report: Report, every: dict[bytes, list[dict[str, Any]]]) -> str:
    """The answers to the markers of the messages delivered more than once: which
    member moved what, and when (the copies are in `report.problems()`)."""
    twice = {s.expect.id for s in report.sources if len(s.deliveries) + len(s.dead) > 1}
    return answers_to(twice, every)


def answered_superseded(report: Report, every: dict[bytes, list[dict[str, Any]]]) -> str:
    """For each message delivered at a time a move replaced: when it was delivered, the
    copies its moves left, every answer to its markers, and the daemons' log lines that
    name it (their decisions, at DEBUG)."""
    late = [s for s in report.moved if s.deliveries and s.expect.id in report.superseded_ids]
    ids = {s.expect.id for s in late}
    lines = [
        f"{s.expect.id}: delivered ts {[d.ts for d in s.deliveries]}, copies "
        f"{[f'{c.topic}[{c.partition}]@{c.offset} ts {c.ts}' for c in s.copies]}"
        for s in late[:5]
    ]
    return "\n".join([*lines, answers_to(ids, every), log_lines(report.logs, ids)])


def log_lines(paths: list[str], ids: set[str], limit: int = 40) -> str:
    """The lines of the daemons' logs that name any of `ids`, at most `limit`."""
    found = []
    for path in paths:
        with contextlib.suppress(OSError), open(path, errors="replace") as log:
            found += [
                f"{Path(path).name}: {line.rstrip()}" for line in log if any(i in line for i in ids)
            ]
    return "daemon log lines naming them:\n  " + "\n  ".join(found[:limit]) if found else ""


def answers_to(ids: set[str], every: dict[bytes, list[dict[str, Any]]]) -> str:
    lines = [
        f"{a['id']}: {a['kind']} {a['outcome']} copy {a.get('copy')} at {a['at']} ts {a['ts']}"
        for found in every.values()
        for a in found
        if a.get("id") in ids
    ]
    return "answers to their markers:\n  " + "\n  ".join(lines[:20]) if lines else ""


def judge(run: Any, report: Report, marked: Marked, guarantee: str, fault_summary: Any) -> None:
    """0 lost, 0 early, 0 cancelled delivered, 0 at a replaced time (exactly-once: 0
    duplicates), and every marker answered as the broker's record of it calls for."""
    every = every_answer(run.bootstrap, run.settings.markers_outcomes_topic)
    got = {key: found[0] for key, found in every.items()}
    keys = {f"{topic}:{partition}:{offset}".encode(): i for i, (topic, partition, offset)
            in enumerate(marked.landed())}  # fmt: skip
    unanswered = [key for key in keys if key not in got]
    cancelled = {s.expect.id for s in report.cancelled}
    raced = {s.expect.id for s in report.raced}  # within the lead: either answer stands
    wrong_answers = [
        (got[key]["id"], got[key]["outcome"])
        for key in keys
        if key in got
        and got[key]["id"] not in raced
        and got[key]["kind"] == "cancel"
        and (got[key]["outcome"] == "cancelled") != (got[key]["id"] in cancelled)
    ]
    moved = {s.expect.id for s in report.moved}
    report.notes.append(
        f"{len(marked.cancels)} cancels ({len(cancelled)} in time), {len(marked.moves)} "
        f"reschedules ({len(moved)} in time); {len(got)} answers, {len(unanswered)} missing"
    )
    _verdict(run, report, fault_summary)  # lost, early, wrong, cancels leaked
    assert not report.superseded, report.problems() + "\n" + answered_superseded(report, every)
    if guarantee == EOS:
        assert report.duplicates == 0, report.problems() + "\n" + answered_twice(report, every)
    assert len(cancelled) >= len(marked.cancels) * 0.9, "the cancels were meant to come in time"
    assert len(moved) >= len(marked.moves) * 0.9, "the reschedules were meant to come in time"
    assert not unanswered, f"{len(unanswered)} markers never answered, e.g. {unanswered[:3]}"
    assert not wrong_answers, f"answers that disagree with the broker: {wrong_answers[:5]}"


@pytest.mark.parametrize(
    ("guarantee", "backlog", "lead"),
    [
        # CI: the default lead exactly-once and no lead at-least-once.
        pytest.param(ALO, 0, "1s", marks=pytest.mark.long),
        (EOS, 0, "1s"),
        (ALO, 0, "0s"),
        pytest.param(EOS, 0, "0s", marks=pytest.mark.long),
        pytest.param(ALO, BACKLOG, "1s", marks=pytest.mark.long),
        pytest.param(EOS, BACKLOG, "1s", marks=pytest.mark.long),
    ],
)
def test_level_cancels_and_reschedules_hold_across_kill_9_and_a_backlog(
    fault_run, kafka_bootstrap, fault_summary, guarantee, backlog, lead
):
    """1,000 level messages due in 3-10 s, a tenth cancelled and a twentieth moved, the
    daemon killed between the markers and the due times and started again. With a
    backlog, 200,000 due records sit ahead of them in the same level partitions, so the
    cancelled messages are read long after their cancels. Under the default
    `cancel_lead` (1s) and the strict one (0s): a marker within the lead of its due
    time races the forward and is not judged (`measure`)."""
    rng = random.Random(SEED)
    run = fault_run(
        kafka_bootstrap, guarantee=guarantee, levels=LEVELS, cancel_lead=lead, log_level=DECISIONS
    )
    target = run.target("lmark")
    name = f"lmark-{run.testbed.tag}"
    producer = _producer(kafka_bootstrap, run.settings)
    if backlog:
        write_backlog(run, target, rng, backlog)
    else:
        daemon = run.fleet.spawn(name)
        run.wait_ready(daemon)
    lead_s = run.settings.cancel_lead_ms / 1000
    marked = send_messages(producer, target, run.sent, rng, MESSAGES, lead_s)
    send_markers(producer, marked, rng)
    marked.landed()  # every marker acknowledged before the kill
    if backlog:
        daemon = run.fleet.spawn(name)
        run.wait_ready(daemon, timeout=120)
        time.sleep(rng.uniform(1.0, 3.0))  # mid-backlog
    else:
        time.sleep(rng.uniform(0.2, 1.5))  # between the markers and the first due time
    daemon.kill()
    daemon = run.fleet.spawn(name)
    run.wait_ready(daemon, timeout=120)
    scenario = f"27. level markers: kill -9{f' behind {backlog:,}' if backlog else ''}"
    scenario += f", cancel_lead {lead}"
    report = run.drain(scenario_name(scenario, guarantee), timeout=240 if backlog else 90)
    judge(run, report, marked, guarantee, fault_summary)


OUTAGE_S = 5.0


@pytest.mark.long
@pytest.mark.parametrize("guarantee", [ALO, EOS])
def test_level_cancels_and_reschedules_hold_across_a_broker_restart(
    own_broker, fault_run, fault_summary, guarantee
):
    """The same 1,000 messages and markers, every marker acknowledged, then the broker
    killed and restarted between the markers and the due times: the markers topic, the
    level partitions and the outcomes topic all go away for the outage, and what falls
    due in it goes late, never early, and never a cancelled one."""
    rng = random.Random(SEED + 2)
    # own_broker first: fixtures tear down in reverse, so the daemon stops before the broker.
    run = fault_run(own_broker.bootstrap, guarantee=guarantee, levels=LEVELS, log_level=DECISIONS)
    target = run.target("lmbroker")
    daemon = run.fleet.spawn(f"lmbroker-{run.testbed.tag}")
    run.wait_ready(daemon)
    producer = _producer(own_broker.bootstrap, run.settings)
    lead_s = run.settings.cancel_lead_ms / 1000
    marked = send_messages(producer, target, run.sent, rng, MESSAGES, lead_s)
    send_markers(producer, marked, rng)
    marked.landed()  # every marker acknowledged before the broker goes
    time.sleep(rng.uniform(0.2, 1.0))
    own_broker.kill()
    time.sleep(OUTAGE_S)  # records fall due meanwhile
    own_broker.restart()
    run.wait_ready(daemon, timeout=120)
    report = run.drain(scenario_name("29. level markers: broker restart", guarantee), 120)
    judge(run, report, marked, guarantee, fault_summary)


def write_backlog(run: Any, target: str, rng: random.Random, count: int) -> None:
    """`count` due records spread over every level and partition, written before the
    daemon starts: ahead of the scenario's messages in the same partitions."""
    with _producer(
        run.bootstrap,
        run.settings,
        **{
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 2 * count,
            "queue.buffering.max.kbytes": 1_048_576,
        },
    ) as producer:
        on_delivery = run.sent.callback(good=True)
        for number in range(count):
            key = f"b{rng.randrange(5_000)}".encode()
            delay = (2.5, 5.5, 9.5)[number % 3]
            producer.produce(target, f"b{number}".encode(), key, delay=delay,
                             on_delivery=on_delivery)  # fmt: skip
            if number % 10_000 == 0:
                producer.poll(0)
        assert producer.flush(120) == 0


class MarkedTraffic:
    """Level messages at a steady pace, a tenth cancelled and a twentieth moved soon
    after they are sent, from a thread of its own."""

    def __init__(self, run: Any, target: str, rate: float, seed: int) -> None:
        self._producer = _producer(run.bootstrap, run.settings)
        self._target = target
        self._rate = rate
        self._rng = random.Random(seed)
        self._sent = run.sent
        self.marked = Marked()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="marked-traffic", daemon=True)

    def start(self) -> MarkedTraffic:
        self._thread.start()
        return self

    def _run(self) -> None:
        started = time.monotonic()
        on_delivery = self._sent.callback(good=True)
        for number in itertools.count():
            if self._stop.is_set():
                return
            delay = self._rng.uniform(3.0, 10.0)
            key = f"k{self._rng.randrange(200)}".encode()
            mid = self._producer.produce(self._target, f"c{number}".encode(), key, delay=delay,
                                         on_delivery=on_delivery)  # fmt: skip
            self.marked.delays[mid] = delay
            draw = self._rng.random()
            if draw < CANCEL_SHARE:
                self.marked.markers.append(self._producer.cancel(mid))
                self.marked.cancels.append(mid)
            elif draw < CANCEL_SHARE + MOVE_SHARE:
                new = self._rng.uniform(0.5, 2.0) if number % 2 else min(delay + 2.0, 9.8)
                self.marked.markers.append(self._producer.reschedule(mid, delay=new))
                self.marked.moves[mid] = new
            self._producer.poll(0)
            pause = started + number / self._rate - time.monotonic()
            if pause > 0:
                self._stop.wait(pause)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert self._producer.flush(60) == 0


SESSION_TIMEOUT_S = 6


@pytest.mark.parametrize("layout", ["shared", pytest.param("per-level", marks=pytest.mark.long)])
@pytest.mark.long
def test_level_cancels_and_reschedules_hold_beside_group_churn(
    fault_run, kafka_bootstrap, fault_summary, layout
):
    """Exactly-once, 2 -> 3 -> 1 members three times (members leave by SIGTERM and by
    kill -9), while messages are sent, cancelled and moved: partitions and the markers'
    answers change hands under them."""
    rng = random.Random(SEED + 1)
    run = fault_run(
        kafka_bootstrap, guarantee=EOS, levels=LEVELS, level_workers=layout, log_level=DECISIONS
    )
    run.fleet.extra_env["DELAYSERVICE_SESSION_TIMEOUT_S"] = str(SESSION_TIMEOUT_S)
    target = run.target("lchurn")
    names = (f"lc{i}-{run.testbed.tag}" for i in itertools.count())
    live = [run.fleet.spawn(next(names)) for _ in range(2)]
    run.wait_ready(*live)
    traffic = MarkedTraffic(run, target, rate=60, seed=SEED).start()
    for round_no in range(3):
        time.sleep(3)
        joiner = run.fleet.spawn(next(names))
        run.wait_ready(joiner)
        live.append(joiner)
        time.sleep(3)
        by_term, by_kill = rng.sample(live, 2)
        by_term.send_sigterm()
        time.sleep(rng.uniform(0, 0.5))
        by_kill.kill()
        by_term.wait_sigterm(30)
        live = [d for d in live if d not in (by_term, by_kill)]
        run.assert_alive()
        if round_no < 2:
            time.sleep(2)
            newcomer = run.fleet.spawn(next(names))
            run.wait_ready(newcomer)
            live.append(newcomer)
    time.sleep(2)
    traffic.stop()
    time.sleep(SESSION_TIMEOUT_S + 4)
    report = run.drain(scenario_name("28. level markers: group 2-3-1 x3", EOS, layout), 120)
    judge(run, report, traffic.marked, EOS, fault_summary)
