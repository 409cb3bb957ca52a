"""Scenarios 17-21: the faults of the suite, struck while a backlog of `BACKLOG` records
due at once is forwarded at full speed (`full_load`).

Each scenario judges every record after every daemon has stopped and every partition
was read to its end: 0 lost and 0 early in each, 0 duplicates for a read_committed
reader under exactly-once. And each checks that the daemon's producer found its local
queue full, so the paths a backlog takes under a fault did run.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaException

from tests.faults.full_load import (
    BACKLOG,
    LeaderWatch,
    OpenTransactions,
    TargetCount,
    queue_filled,
    write_backlog,
)
from tests.faults.harness import DaemonProcess, now_ms, scenario_name, wait_until
from tests.faults.log_dirs import deleted_everywhere
from tests.faults.measure import Report, Source

pytestmark = pytest.mark.kafka

SEED = 17_017
STRIKE = BACKLOG // 5
"""Forwards on the target when the fault strikes: a fifth of the way."""
FORWARD_TIMEOUT_S = 240.0
GAP_REASONS = {b"unknown_topic", b"unknown_partition"}
PRODUCER_QUEUE = 2_000
"""The daemon producer's local queue, in records. librdkafka's default (100,000) never
filled here: each commit point waits for what it sent, so between two of them the
forwarder sends at most a pass or two (`TAKE` records each). A smaller queue makes the
forwarder wait for room on every pass, the state a larger backlog or a slower broker
puts it in with the default."""

ALO, EOS = "at-least-once", "exactly-once"
# CI runs one row per guarantee (not `long`); --all runs every row.
BOTH = [pytest.param(ALO, marks=pytest.mark.long), pytest.param(EOS, marks=pytest.mark.long)]


class FullLoad:
    """One scenario: the backlog written, the daemons started, the fault struck."""

    def __init__(self, run: Any, name: str, session_timeout_s: int | None = None) -> None:
        self.run = run
        self.name = name
        if session_timeout_s is not None:
            run.fleet.extra_env["DELAYSERVICE_SESSION_TIMEOUT_S"] = str(session_timeout_s)
        run.fleet.extra_env["DELAYSERVICE_PRODUCER"] = json.dumps(
            {"queue.buffering.max.messages": str(PRODUCER_QUEUE)}
        )
        self.target = run.target(name)
        write_backlog(run.bootstrap, run.settings, self.target, run.sent, SEED)
        self.count = TargetCount(run.bootstrap, self.target)
        self.filled: list[float] = []

    def spawn(self, suffix: str = "") -> DaemonProcess:
        daemon = self.run.fleet.spawn(f"{self.name}{suffix}-{self.run.testbed.tag}")
        self.run.wait_ready(daemon)
        return daemon

    def strike_when_forwarded(self, count: int = STRIKE) -> int:
        return self.count.wait_for(count, FORWARD_TIMEOUT_S)

    def note_queue(self, *daemons: DaemonProcess) -> Callable[[], None]:
        """A `while_live` check: read how often the live daemons found the queue full."""
        return lambda: self.filled.append(queue_filled(*daemons))

    def verdict(self, report: Report, guarantee: str, fault_summary: Any) -> None:
        self.count.close()
        report.notes.append(
            f"{BACKLOG:,} due at once; struck at {STRIKE:,} forwarded; "
            f"producer queue found full {sum(self.filled):.0f} times after the fault"
        )
        fault_summary(report)
        self.run.assert_alive()
        assert not report.lost, report.problems()
        assert not report.early, report.problems()
        assert not report.wrong, report.problems()
        if guarantee == EOS:
            assert report.duplicates == 0, report.problems()
        assert sum(self.filled) > 0, "the producer's queue never filled: the backlog was too slow"


def _row(number: int, what: str, guarantee: str) -> str:
    return scenario_name(f"{number}. full load: {what}", guarantee)


@pytest.mark.parametrize("guarantee", BOTH)  # CI runs kill -9 at a lighter load (row 2)
def test_full_load_kill_9_then_restart(fault_run, kafka_bootstrap, fault_summary, guarantee):
    run = fault_run(kafka_bootstrap, guarantee=guarantee)
    load = FullLoad(run, "fl-kill", session_timeout_s=45)
    daemon = load.spawn()
    load.strike_when_forwarded()
    daemon.kill()
    daemon = load.spawn()  # the same name: static membership, its partitions at once
    report = run.drain(
        _row(17, "kill -9 + restart", guarantee),
        FORWARD_TIMEOUT_S,
        while_live=load.note_queue(daemon),
    )
    load.verdict(report, guarantee, fault_summary)


FREEZE_S = 35.0
"""Past the daemon producer's message timeout (30 s) and the transaction timeout (10 s)."""


@pytest.mark.parametrize("guarantee", BOTH)
def test_full_load_broker_frozen(own_broker, fault_run, fault_summary, guarantee):
    run = fault_run(own_broker.bootstrap, guarantee=guarantee)
    load = FullLoad(run, "fl-freeze")
    daemon = load.spawn()
    load.strike_when_forwarded()
    filled_before = queue_filled(daemon)
    own_broker.freeze()
    try:
        time.sleep(FREEZE_S)  # holding the freeze; in-flight forwards time out
    finally:
        own_broker.thaw()
    levels = [level.topic for level in run.settings.level_set().levels]
    leaders = LeaderWatch(own_broker.bootstrap, [load.target, *levels]).start()
    try:
        report = run.drain(
            _row(18, f"broker SIGSTOP {FREEZE_S:.0f} s", guarantee),
            FORWARD_TIMEOUT_S,
            while_live=load.note_queue(daemon),
        )
    finally:
        report_line = leaders.stop()
    report.notes.append(report_line)
    load.filled = [max(0.0, f - filled_before) for f in load.filled]
    load.verdict(report, guarantee, fault_summary)


OUTAGE_S = 5.0


@pytest.mark.parametrize("guarantee", BOTH)
def test_full_load_broker_restart(own_broker, fault_run, fault_summary, guarantee):
    run = fault_run(own_broker.bootstrap, guarantee=guarantee)
    load = FullLoad(run, "fl-restart")
    daemon = load.spawn()
    load.strike_when_forwarded()
    filled_before = queue_filled(daemon)
    own_broker.kill()
    time.sleep(OUTAGE_S)  # holding the outage
    own_broker.restart()
    report = run.drain(
        _row(19, f"broker down {OUTAGE_S:.0f} s + restart", guarantee),
        FORWARD_TIMEOUT_S,
        while_live=load.note_queue(daemon),
    )
    load.filled = [max(0.0, f - filled_before) for f in load.filled]
    load.verdict(report, guarantee, fault_summary)


GAP_S = 4.0
PAUSE_TIMEOUT_S = 60.0


@pytest.mark.parametrize("guarantee", BOTH)
def test_full_load_target_deleted_and_recreated(
    fault_run, kafka_bootstrap, fault_summary, guarantee
):
    """The target is deleted mid-backlog and created again. To count exactly what went
    to the old topic, the daemon is frozen (SIGSTOP) while the old topic is read to its
    end and deleted, and thawed only when the broker hosts no log of it.

    Two waits make the count exact. Under exactly-once the frozen daemon's transaction
    is left to the coordinator, which aborts it at the transaction timeout: records of
    an open transaction cannot be read, and committed after the deletion they would
    vanish with the topic unseen (the coordinator skips the markers of deleted
    partitions). And the metadata says a topic is gone a moment before the broker stops
    appending to it: what the daemon sent in that moment would be acked and vanish
    too. What falls due in the gap may be dead-lettered as unknown_topic; everything
    else reaches the old topic or the new one; nothing is silently dropped."""
    run = fault_run(kafka_bootstrap, guarantee=guarantee)
    load = FullLoad(run, "fl-recreate", session_timeout_s=45)
    daemon = load.spawn()
    load.strike_when_forwarded()
    assert daemon.process is not None
    daemon.process.send_signal(signal.SIGSTOP)
    undecided = OpenTransactions(kafka_bootstrap, load.target)
    try:
        open_on: list[int] = []

        def all_decided() -> bool:
            open_on[:] = undecided.partitions()
            return not open_on

        assert wait_until(all_decided, PAUSE_TIMEOUT_S, interval=0.5), (
            f"{load.target}: the frozen daemon's transaction stayed open on {open_on}"
        )
        reader = run.read()
        assert wait_until(reader.catch_up, PAUSE_TIMEOUT_S, interval=0.5), (
            f"{load.target}: the read-back never reached its end"
        )
        old = f"{load.target} (deleted)"
        reader.remove(load.target)
        reader.rename(load.target, old)
        admin = run.testbed.admin
        admin.delete_topics([load.target])[load.target].result(30)
        run.testbed.wait_for(
            lambda: deleted_everywhere(admin, load.target), 30, "the broker to stop the topic"
        )
        deleted = now_ms()
    finally:
        daemon.process.send_signal(signal.SIGCONT)
        undecided.close()
    time.sleep(GAP_S)  # holding the gap; the daemon forwards into a missing topic

    def recreate() -> bool:
        try:
            run.testbed.create_topic(load.target, 3, {"message.timestamp.type": "LogAppendTime"})
        except KafkaException:
            return False  # still marked for deletion
        return True

    assert wait_until(recreate, 30, interval=0.5), f"{load.target} could not be re-created"
    reader.add([load.target])

    def in_the_gap(source: Source) -> bool:
        return bool(source.dead) and all(
            letter.header("dlq-reason") in GAP_REASONS and letter.ts >= deleted - 1_000
            for letter in source.dead
        )

    report = run.drain(
        _row(20, "target deleted + re-created", guarantee),
        FORWARD_TIMEOUT_S,
        may_dead_letter=in_the_gap,
        while_live=load.note_queue(daemon),
    )
    report.notes.append(f"{len(reader.records[old]):,} forwarded to the deleted incarnation")
    load.verdict(report, guarantee, fault_summary)


MEMBER_SESSION_S = 10
MEMBER_FREEZE_S = MEMBER_SESSION_S + 8.0


@pytest.mark.long
def test_full_load_member_frozen_past_its_session_loses_its_partitions_while_live(
    fault_run, kafka_bootstrap, fault_summary
):
    """Exactly-once, two members: one is frozen past its session timeout mid-backlog.
    The other takes its partitions (waiting while the frozen one's open transaction
    holds their offsets); the frozen one wakes to find them lost, and nothing it held
    may commit."""
    run = fault_run(kafka_bootstrap, guarantee=EOS)
    load = FullLoad(run, "fl-member", session_timeout_s=MEMBER_SESSION_S)
    frozen = load.spawn("-a")
    other = load.spawn("-b")
    load.strike_when_forwarded()
    assert frozen.process is not None
    frozen.process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(MEMBER_FREEZE_S)  # holding the freeze past the session timeout
    finally:
        frozen.process.send_signal(signal.SIGCONT)
    report = run.drain(
        _row(21, f"a member frozen {MEMBER_FREEZE_S:.0f} s (session {MEMBER_SESSION_S} s)", EOS),
        FORWARD_TIMEOUT_S,
        while_live=load.note_queue(frozen, other),
    )
    load.verdict(report, EOS, fault_summary)
