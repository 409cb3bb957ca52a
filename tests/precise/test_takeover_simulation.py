"""The precise worker's simulation with two copies (issue 47): two members, each the
owner of one partition of the precise topic and the replica of the other's
(`replicas = 2`, `precise_members = 2`), stepped from the test's thread over the same
fakes as the one-member simulation (`tests/precise/test_worker_simulation.py`, whose
rules, invariants and fakes this reuses). A member can be frozen (its steps stop) past
the takeover delay and come back, or killed -9 with or without its data directory;
its replica then takes over what it did not report done. What it models and what it
leaves out: docs/simulation.md, "The takeover simulation".

Nothing runs on a thread of its own: each member's intake, loader, forwarder, takeover
forwarder (exactly-once) and progress reader (`Progress._read`'s body) run one turn at a
time, as its thread would. The invariants after every step are the one-member
simulation's, over both members (a record is lost once neither member will read it
again and it is on neither disk, nor forwarded or dead-lettered), and two of the
takeover's own:

- a replica forwards a record no sooner than its due time plus the takeover delay;
- at-least-once, a record forwarded by both of its holders comes from the seconds
  around a fault of its owner (docs/precise-mode.md, "Limits, known": an owner that dies
  forwards up to a report interval plus one slot it has not reported, and its replica
  sends those again; an owner that comes back within the takeover delay of records the
  replica took over may send them too). Exactly-once, never twice (the one-member
  invariant, over every producer of both members).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Final

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from delayservice.kafka.client_errors import raised_by
from delayservice.kafka.ready_batch import ready_batch
from delayservice.precise import precise_worker as precise_worker_module
from delayservice.precise.delivery import progress as progress_module
from delayservice.precise.delivery.progress import REPORT_EVERY_S, Progress
from tests.level.fakes import TARGET, FakeClock, FakeProducer, _source_of
from tests.precise.takeover_rig import ReportProducer
from tests.precise.test_worker_simulation import (
    PreciseWorkerSimulation,
    _no_real_waits,
    _simulation,
)
from tests.simulation import EXAMPLES, Members, outlived_its_timeout, run_guarantee

__all__ = ["_no_real_waits"]  # the one-member simulation's fixture, used here too

MEMBERS: Final = (0, 1)
TAKEOVER_S: Final = 10.0
"""`takeover_delay_s`: well past what a report takes to reach the replica here (a
commit point, a loader pass that writes the settled marks, an intake turn that reports,
a reader turn: a few one-second rounds of `time_passes`)."""
ROUND_S: Final = 1.0
"""`time_passes` moves the clock in rounds of at most this, each member's threads
running once per round: threads loop many times a second, and a coarser step would
make a live owner look far behind."""
SLOT_S: Final = 1.0
SEEDS: Final = {False: 4721, True: 4722}
"""The seed of each guarantee's run (at-least-once, exactly-once), unless
DELAYSERVICE_SIM_SEED gives another."""
PER_MEMBER: Final = (
    "worker",
    "keeper",
    "faults",
    "fatal",
    "intake_alive",
    "loader_alive",
    "forwarder_alive",
    "takeover_alive",
)
"""What the one-member simulation keeps of its one process, kept per member here and
loaded into the simulation while that member steps (`_as`)."""


class SteppedProgress(Progress):
    """The progress reader, stepped: `turn` is one pass of `Progress._read`'s loop on
    the test's thread, and a wait for the reader (`wait_read_past`) runs turns while
    the clock moves by the wait, as the thread would meanwhile."""

    clock: FakeClock

    def start(self) -> None:
        """Not a thread: the simulation calls `turn`."""

    def turn(self) -> None:
        consumer = getattr(self, "_consumer", None)
        if consumer is None:  # `_read`'s start
            consumer = self._make_consumer({"isolation.level": "read_committed"})
            consumer.assign([TopicPartition(self._topic, 0, OFFSET_BEGINNING)])
            self._consumer, self._end = consumer, None
        if self._end is None:
            low, self._end = consumer.get_watermark_offsets(
                TopicPartition(self._topic, 0), timeout=10.0
            )
            if self._end <= low:
                self._advance(self._end)
                self._caught_up.set()
        for message in ready_batch(consumer, 500, 0):
            if message.error() is not None:  # `_read` logs any but an end of partition
                continue
            self._take(message.value(), message.key())
            if (message.offset() or 0) + 1 >= self._end:
                self._caught_up.set()
        self._advance(consumer.position([TopicPartition(self._topic, 0)])[0].offset)

    def wait_read_past(self, offset: int, timeout_s: float) -> bool:
        deadline = self.clock.monotonic() + timeout_s
        while True:
            self.turn()
            if self._position >= offset:
                return True
            left = deadline - self.clock.monotonic()
            if left <= 0:
                return False
            self.clock.advance(min(0.5, left))


class ReportingProducer(FakeProducer):
    """The process's shared producer: progress reports on the done topic are written at
    once (non-transactional, read by every holder's progress reader); replies to
    markers as the one-member simulation's."""

    def __init__(self, topics: dict[str, int], clock: FakeClock, done_topic: str, to: Any) -> None:
        super().__init__(topics, clock)
        self.done_topic = done_topic
        self.to = to

    def produce(self, topic: str, value: Any = None, key: Any = None, **kwargs: Any) -> None:
        if topic == self.done_topic:
            self.to.produce(topic, value, key)
            return
        super().produce(topic, value, key, **kwargs)


class TakeoverSimulation(Members, PreciseWorkerSimulation):
    PER_MEMBER = PER_MEMBER

    def __init__(self) -> None:
        self.member = 0
        """The member loaded into the simulation's per-process attributes."""
        self.kept: dict[int, dict[str, Any]] = {0: {}, 1: {}}
        self.frozen: dict[int, float | None] = {0: None, 1: None}
        """Member -> when its freeze began (None: running)."""
        self.group_commits: dict[int, dict[tuple[str, int], int]] = {0: {}, 1: {}}
        """Each member's group's committed offsets (each commits under its own group)."""
        self.roots: dict[int, int] = {0: 0, 1: 0}
        """Each member's data directories so far (a new one after a loss)."""
        self.disks_lost = 0
        self.by_member: dict[int, int] = {}
        """id(producer) -> the member whose process made it."""
        self.outages: dict[int, list[tuple[float, float, str]]] = {0: [], 1: []}
        """Per member, (from, to, what) in clock seconds: a freeze, a kill, a restart,
        a failure reported, a fault that fired in a step."""
        self.noted: dict[int, tuple[int, int]] = {}
        """Per member, (id of its faults, how many of their log entries are noted)."""
        self.last_check = 0.0
        self.takeover_alive = True
        super().__init__()
        self._store()
        self.member = 1
        self.worker = None
        self._start()
        self.last_check = self.clock.time()

    def _wire(self) -> None:
        stepped = type("Stepped", (SteppedProgress,), {"clock": self.clock})
        self._patch(precise_worker_module, "Progress", stepped)
        self._patch(progress_module, "time", self.clock)

    # -- two members -------------------------------------------------------------------
    def _data_dir(self) -> Path:
        return self.root / f"member-{self.member}-{self.roots[self.member]}"

    def _more_settings(self) -> dict[str, Any]:
        return {
            "replicas": 2,
            "precise_members": len(MEMBERS),
            "precise_member": self.member,
            "takeover_delay_s": TAKEOVER_S,
        }

    def _answer_producer(self) -> FakeProducer:
        settings = self.settings
        return ReportingProducer(
            dict(self.topics),
            self.clock,
            settings.precise_done_topic,
            ReportProducer(self.coordinator, self.clock),
        )

    def _start(self) -> None:
        if self.worker is not None and self.worker.progress is not None:
            self._note(self.member, "restarted")
        super()._start()
        self.takeover_alive = True

    def _new_producer(self, config: dict[str, Any]) -> FakeProducer:
        producer = super()._new_producer(config)
        self.by_member[id(producer)] = self.member
        return producer

    def _new_consumer(self, config: dict[str, Any]) -> Any:
        """The one-member simulation's; the intake commits under its member's group."""
        consumer = super()._new_consumer(config)
        if hasattr(consumer, "committed_tps"):
            consumer.committed_tps = self.group_commits[self.member]
        return consumer

    def _commits(self) -> dict[tuple[str, int], int]:
        """A record is read again while either member's group has not committed past it."""
        tps = set(self.group_commits[0]) & set(self.group_commits[1])
        return {tp: min(self.group_commits[m][tp] for m in MEMBERS) for tp in tps}

    def _on_disk(self, partition: int) -> set[int]:
        held: set[int] = set()
        for member in MEMBERS:
            with self._as(member):
                held |= super()._on_disk(partition)
        return held

    @property
    def running(self) -> bool:
        return all(self._alive(member) for member in MEMBERS)

    def _alive(self, member: int) -> bool:
        with self._as(member):
            return (
                self.intake_alive
                and self.loader_alive
                and self.forwarder_alive
                and self.takeover_alive
            )

    def _note(self, member: int, what: str, since: float | None = None) -> None:
        now = self.clock.time()
        self.outages[member].append((now if since is None else since, now, what))

    # -- stepping ----------------------------------------------------------------------
    def _turn(self, turn: str) -> None:
        """One turn of the loaded member's thread `turn`, if it runs."""
        if not self._alive(self.member):
            return
        if turn == "progress":
            progress = self.worker.progress  # type: ignore[union-attr]
            assert isinstance(progress, SteppedProgress)
            progress.turn()
        elif turn == "takeover":
            self._takeover_pass()
        else:
            {"intake": self._intake_turn, "loader": self._loader_pass}.get(
                turn, self._forwarder_pass
            )()

    def _takeover_pass(self) -> None:
        """One pass of the takeover forwarder (exactly-once), as `_forwarder_pass`."""
        forwarder = self.worker.takeover_forwarder  # type: ignore[union-attr]
        if forwarder is not None and not self._survives_a_pass(forwarder):
            self.takeover_alive = False

    def _round(self, turns: list[str]) -> None:
        for member in MEMBERS:
            if self.frozen[member] is None:
                with self._as(member):
                    for turn in turns:
                        self._turn(turn)

    # -- rules -------------------------------------------------------------------------
    @rule(seconds=st.sampled_from([0.01, 0.05, 0.2, 0.5, 1.0, 3.0]))
    def time_passes(self, seconds: float) -> None:
        """Time passes in rounds of at most `ROUND_S`; in each, every member not frozen
        runs an intake turn, a reader turn, a loader pass, its forwarders' passes and
        an intake turn."""
        left = seconds
        while left > 0:
            step = min(ROUND_S, left)
            left -= step
            self.clock.advance(step)
            self._round(["intake", "progress", "loader", "forwarder", "takeover", "intake"])

    @rule(
        member=st.sampled_from(MEMBERS),
        turns=st.lists(
            st.sampled_from(["intake", "progress", "loader", "forwarder", "takeover"]),
            min_size=1,
            max_size=4,
        ),
    )
    def threads_run(self, member: int, turns: list[str]) -> None:  # type: ignore[override]
        if self.frozen[member] is not None:
            return
        with self._as(member):
            for turn in turns:
                self._turn(turn)

    @rule(
        member=st.sampled_from(MEMBERS),
        client=st.sampled_from(["consumer", "producer"]),
        data=st.data(),
    )
    def next_call_fails(self, member: int, client: str, data: st.DataObject) -> None:  # type: ignore[override]
        with self._as(member):
            super().next_call_fails(client, data)

    @precondition(lambda self: "queue_full" in self.shapes)
    @rule(member=st.sampled_from(MEMBERS), data=st.data())
    def queue_fills_then_a_call_fails(self, member: int, data: st.DataObject) -> None:  # type: ignore[override]
        with self._as(member):
            super().queue_fills_then_a_call_fails(data)

    @precondition(lambda self: None in self.frozen.values())
    @rule(member=st.sampled_from(MEMBERS))
    def member_freezes(self, member: int) -> None:
        """The member's process stands still (stopped, starved, a long GC): none of its
        threads runs until it thaws; what it holds in memory and its open transaction
        stay."""
        if self.frozen[member] is None and self.frozen[1 - member] is None:
            self.frozen[member] = self.clock.time()

    @rule()
    def frozen_member_thaws(self) -> None:
        for member, since in self.frozen.items():
            if since is not None:
                self._thaw(member, since)

    def _thaw(self, member: int, since: float) -> None:
        self.frozen[member] = None
        self._note(member, "frozen", since)
        stood = self.clock.time() - since
        for producer in self.broker.producers:
            if self.by_member.get(id(producer)) == member:
                outlived_its_timeout(producer, stood)

    @precondition(lambda self: None in self.frozen.values())
    @rule(
        member=st.sampled_from(MEMBERS),
        after_s=st.sampled_from([0.0, 0.01, 0.5, 1.0, 2.0]),
        past_s=st.sampled_from([0.5, 2.0, 6.0]),
        back=st.booleans(),
    )
    def owner_frozen_past_the_takeover_delay(
        self, member: int, after_s: float, past_s: float, back: bool
    ) -> None:
        """Weighted: `after_s` pass (records due soon go, and are not reported yet),
        the member freezes, and the takeover delay and `past_s` more pass while the
        other runs: its replica takes over what it had not reported done; then it comes
        back, or not yet."""
        self.time_passes(after_s)
        self.member_freezes(member)
        self.time_passes(TAKEOVER_S + past_s)
        since = self.frozen[member]
        if back and since is not None:
            self._thaw(member, since)

    @precondition(lambda self: self.processes <= 2)
    @rule(
        member=st.sampled_from(MEMBERS),
        disk=st.sampled_from(["kept", "kept", "lost"]),
        landed=st.booleans(),
    )
    def killed_and_restarted(self, member: int, disk: str, landed: bool) -> None:  # type: ignore[override]
        """The member's process dies at once (kill -9; frozen or not); a new one starts
        on its data directory, or on an empty one (its disk lost: once per example,
        the promise is to survive one), from its group's committed offsets. What its
        producers had queued reached the broker before the kill (`landed`: librdkafka
        sends within its linger, so this is the likelier), or died with it."""
        self.processes += 1
        since = self.frozen[member]
        self.frozen[member] = None
        self._note(member, "killed", since)
        with self._as(member):
            self.faults.disarm()
            for producer in self.broker.producers:
                if landed and self.by_member.get(id(producer)) == member:
                    # Acknowledged, though no one is left to hear it (a fatal producer
                    # raises its error once: that process is gone).
                    raised_by(lambda producer=producer: producer.flush(0))
            if disk == "lost" and self.disks_lost == 0:
                self.disks_lost += 1
                worker = self.worker
                assert worker is not None
                worker.disk.close()
                shutil.rmtree(worker.disk.root, ignore_errors=True)
                self.roots[member] += 1
            self._start()

    @rule()
    def faults_stop_and_time_passes(self) -> None:
        """Every member thaws, nothing more fails, and a minute passes with both
        running: every record due by then was forwarded or dead-lettered (the drain
        that shows a loss), and every marker answered."""
        for member, since in list(self.frozen.items()):
            if since is not None:
                self._thaw(member, since)
        for member in MEMBERS:
            with self._as(member):
                self.faults.disarm()
        super().faults_stop_and_time_passes()

    # -- invariants --------------------------------------------------------------------
    @invariant()
    def promises_hold(self) -> None:
        self._note_faults()
        super().promises_hold()
        self.a_replica_waits_the_takeover_delay()
        self.duplicates_only_around_an_owners_fault()

    def _note_faults(self) -> None:
        """Faults that fired since the last check, as outages of their member (between
        the last check and now: when in the step is not known)."""
        now = self.clock.time()
        for member in MEMBERS:
            faults = self.faults if member == self.member else self.kept[member]["faults"]
            seen_id, seen = self.noted.get(member, (id(faults), 0))
            if seen_id != id(faults):
                seen = 0
            for what in faults.log[seen:]:
                self.outages[member].append((self.last_check, now, what))
            self.noted[member] = (id(faults), len(faults.log))
        self.last_check = now

    def _forwards(self) -> list[tuple[tuple[tuple[str, int], int], int, float]]:
        """(record, the member that sent it, when) of each forward a reader sees."""
        out = []
        for producer in self.broker.producers:
            member = self.by_member.get(id(producer))
            if member is None:
                continue
            for sent in producer.visible():
                source = _source_of(sent)
                if source is not None and sent.topic == TARGET:
                    out.append((source, member, sent.at))
        return out

    def a_replica_waits_the_takeover_delay(self) -> None:
        """A replica's copy fires at its due time plus the takeover delay."""
        for spot, member, at in self._forwards():
            if member == spot[0][1] % len(MEMBERS):
                continue  # the owner's
            fire_ms = self._earliest_ms(spot) + TAKEOVER_S * 1000
            self._check(
                at * 1000 >= fire_ms - 0.001,
                f"TAKEOVER EARLY: {spot} was sent by its replica (member {member}) at {at}, "
                f"before its due time plus the takeover delay ({fire_ms / 1000})",
            )

    def duplicates_only_around_an_owners_fault(self) -> None:
        """At-least-once: a record both holders forwarded went twice around a fault of
        its owner (a freeze, a kill, a restart, a failure, a fault that fired), from
        the takeover delay before the first send to the last."""
        if self.exactly_once:
            return
        sends: dict[tuple[tuple[str, int], int], dict[int, list[float]]] = {}
        for spot, member, at in self._forwards():
            sends.setdefault(spot, {}).setdefault(member, []).append(at)
        for spot, by in sorted(sends.items()):
            if len(by) < 2:
                continue
            owner = spot[0][1] % len(MEMBERS)
            times = [at for ats in by.values() for at in ats]
            first, last = min(times), max(times)
            now = self.clock.time()
            frozen = self.frozen[owner]
            standing = [] if frozen is None else [(frozen, now, "frozen, still")]
            around = [
                what
                for since, until, what in self.outages[owner] + standing
                if until >= first - TAKEOVER_S - REPORT_EVERY_S - SLOT_S and since <= last
            ]
            self._check(
                bool(around),
                f"TWICE WITHOUT A FAULT: {spot} was sent by its owner (member {owner}) at "
                f"{by.get(owner)} and by its replica at {by.get(1 - owner)}, with no fault "
                f"of the owner around (its outages: {self.outages[owner]})",
            )

    def every_thread_alive_or_reported(self) -> None:
        for member in MEMBERS:
            with self._as(member):
                if not self._alive(member):
                    self._check(bool(self.fatal), f"member {member}: a thread ended unreported")
                    self.fatal_reports.extend(self.fatal)
                    self._note(member, f"failed: {self.fatal}")
                    self.frozen[member] = None
                    self._start()


@pytest.mark.timeout(300 + 4 * EXAMPLES)  # shrinking a failure takes up to five minutes
@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_a_replica_takes_over_and_the_promises_hold(exactly_once: bool) -> None:
    run_guarantee(TakeoverSimulation, exactly_once, SEEDS, "Takeover")


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
@pytest.mark.parametrize("disk", ["frozen", "kept", "lost"])
def test_the_replica_sends_what_its_owner_did_not_once(exactly_once: bool, disk: str) -> None:
    """The rules written out: a record on member 0's partition, read by both holders;
    member 0 is frozen (or killed, with its data directory or without it) before the
    record is due, and the takeover delay passes: member 1, its replica, sends it. The
    owner back, and a quiet minute: sent once, by the replica. This shows the
    simulation reaches a takeover at all (the random runs' invariants pass trivially
    without one)."""
    with _simulation(exactly_once, TakeoverSimulation) as sim:
        sim.faults_stop_and_time_passes()  # started, caught up, learned
        sim.records_arrive(0, 1, 1_500, True)
        sim.time_passes(0.5)  # both intakes hold it
        sim.member_freezes(0)
        sim.time_passes(TAKEOVER_S + 3.0)
        if disk != "frozen":  # killed as it stood, then started again
            sim.killed_and_restarted(0, disk, landed=True)
        sim.promises_hold()
        sim.faults_stop_and_time_passes()
        sim.promises_hold()
        assert [member for spot, member, _ in sim._forwards()] == [1]
