"""The level worker's simulation with two live members of one consumer group (issue 47):
two processes, each a level worker with its own consumer, producer, forwarder, marker
reader and book, over one fake broker (shared logs, one group: its committed offsets
and its generation, `fakes.FakeGroup`). Partitions move between them as the group's
cooperative rebalances move them: revoked on the old owner (its hand-over, as the
daemon's callbacks do it) and only then assigned to the new one; or lost by the old
owner (its session expired: the group has moved on and the new owner may start before
the old one hears of it); or a member is killed -9 and the other is given its
partitions. Markers are read by both members' readers and answered by the owner.

It subclasses the one-member simulation (`test_worker_simulation`) and reuses its
rules, fakes and invariants, run as each member in turn (`simulation.Members`), as the
precise takeover simulation does. What it models and what it leaves out:
docs/simulation.md, "The two-member level simulation".

The invariants after every step, across both members: the one-member ones (nothing
committed past a record that was not sent, in the group's shared offsets; nothing
forwarded before it is due; a cancel in time honoured; a reschedule in time honoured;
exactly-once, no message in two committed transactions of any producer of either
member, and nothing committed of a partition its member did not own; no wake-up lost;
no purge taken for a failure; every thread alive or its failure reported), and two of
its own:

- a member forwards a record only once its own reader has read the markers through
  the record's due time less `cancel_lead` (`WorkerMarkers.through_ms`, noted at the
  `produce()` call);
- at-least-once, a message sent by both members comes from around a move of one of
  its records' partitions (a revoke, a loss, a kill): checked loosely, as the takeover
  simulation checks its duplicates; twice by one member alone is not checked.
"""

from __future__ import annotations

from typing import Any, Final

import pytest
from confluent_kafka import KafkaError
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from delayservice.envelope import H_MOVED_BY
from delayservice.kafka.client_errors import raised_by
from tests.level.fakes import TARGET, FakeGroup, FakeProducer, Sent
from tests.level.test_worker_simulation import (
    PARTITIONS,
    RESTARTS,
    SHAPES,
    A,
    B,
    C,
    LevelWorkerSimulation,
    _Drawn,
    _no_real_waits,
    _time_passes,
    examples_on,
)
from tests.simulation import EXAMPLES, Members, run_guarantee

__all__ = ["_no_real_waits"]  # the one-member simulation's fixture, used here too

MEMBERS: Final = (0, 1)
SEEDS: Final = {False: 4731, True: 4732}
"""The seed of each guarantee's run (at-least-once, exactly-once), unless
DELAYSERVICE_SIM_SEED gives another."""
CI_EXAMPLES: Final = EXAMPLES // 2
"""Two members cost each step about twice one's: CI runs half the one-member count."""
TP = tuple[str, int]
_COORDINATOR_ABORTED: Final = KafkaError(
    KafkaError.INVALID_PRODUCER_EPOCH,
    "sim: the coordinator aborted the transaction (transaction.timeout.ms)",
)


class TwoMemberSimulation(Members, LevelWorkerSimulation):
    PER_MEMBER = (
        "rig",
        "faults",
        "reader",
        "reader_consumer",
        "reader_alive",
        "reader_death",
        "consumer_alive",
        "forwarder_alive",
        "sleeper",
        "assignment",
    )

    def __init__(self) -> None:
        self.member = 0
        self.kept = {0: {}, 1: {}}
        self.group = FakeGroup()
        """The one consumer group both members are in: its generation."""
        self.by_member: dict[int, int] = {}
        """id(producer) -> the member whose process made it."""
        self.moving: dict[TP, tuple[int, int]] = {}
        """Partition -> (old owner, new owner): revoked, assigned to the new owner once
        the old one has let it go (the cooperative protocol's second rebalance)."""
        self.moves: list[tuple[float, TP, str]] = []
        """(when, partition, how) of each change of owner: revoked, lost, killed."""
        self.gate_at_send: dict[int, tuple[int, dict[tuple[TP, int], int]]] = {}
        """id(sent) of a forward -> (its member, how far that member's markers were read
        for each record of its message, `through_ms`, at the produce() call)."""
        self.timed_out = 0
        """Open transactions holding offsets of a partition given to another member,
        aborted by the coordinator (`_offsets_stable`)."""
        self.reader_death = ""
        self.starting = True
        super().__init__()
        self._store()
        self.member = 1
        self._start(assign=self._share(1))
        self.starting = False

    @staticmethod
    def _share(member: int) -> set[TP]:
        """What the group assigns each member at the start: every other partition."""
        return {tp for i, tp in enumerate(PARTITIONS) if i % len(MEMBERS) == member}

    # -- a member's process ------------------------------------------------------------
    def _start(self, assign: set[TP]) -> None:
        """The one-member simulation's process, its clients in the shared group; the
        first start is member 0's with its share."""
        if self.starting and self.member == 0:
            assign = self._share(0)
        super()._start(assign)
        self.rig.consumer.group = self.group
        self._wired(self.rig.producer)
        keeper, rebuild = self.rig.loop.keeper, self.rig.forwarder.rebuild
        make_consumer, make_producer = keeper._make, rebuild.make

        def joined(config: dict[str, Any]) -> Any:
            """A consumer replacing one that failed: the one-member simulation makes every
            producer of the broker its owner; the other member's stay with theirs."""
            consumer = make_consumer(config)
            consumer.group = self.group
            for producer in self.broker.producers:
                member = self.by_member.get(id(producer))
                if member is not None and member != self.member:
                    producer.owner = self.kept[member]["rig"].consumer
            return consumer

        def rebuilt() -> FakeProducer:
            producer = make_producer()
            self._wired(producer)
            return producer

        keeper._make = joined
        rebuild.make = rebuilt

    def _wired(self, producer: FakeProducer) -> None:
        """Note the producer's member, and at each forward how far its markers were read."""
        member, markers = self.member, self.rig.markers
        assert markers is not None
        self.by_member[id(producer)] = member

        def noted(sent: Sent) -> None:
            if sent.topic != TARGET:
                return
            spots = self.records.get(sent.delay_id or "", [])
            spots = spots[1:] if sent.header(H_MOVED_BY) is not None else spots[:1]
            through = {spot: markers.through_ms(spot[0][1]) for spot in spots}
            self.gate_at_send[id(sent)] = (member, through)

        producer.on_produce = noted

    @property
    def running(self) -> bool:
        """The member loaded's threads (the one-member simulation's, as that member)."""
        return self.consumer_alive and self.forwarder_alive and self.reader_alive

    def _alive(self, member: int) -> bool:
        with self._as(member):
            return self.running

    def _owner(self, tp: TP) -> int | None:
        for member in MEMBERS:
            with self._as(member):
                if tp in self.assignment:
                    return member
        return None

    # -- the group ---------------------------------------------------------------------
    def _rebalanced(self, gains: dict[int, set[TP]], how: str) -> None:
        """One rebalance of the group: its generation moves, and each member hears of it
        at its next consume(), with the partitions it gains (none: it rejoins)."""
        self._offsets_stable({tp for tps in gains.values() for tp in tps})
        self.group.generation += 1
        for member in MEMBERS:
            with self._as(member):
                gained = gains.get(member, set()) - self.assignment
                self.assignment |= gained
                self.rig.consumer.queue_rebalance("assign", *sorted(gained))
                for tp in gained:
                    self.moves.append((self.clock.time(), tp, how))

    def _offsets_stable(self, tps: set[TP]) -> None:
        """KIP-447: a read_committed member newly assigned a partition starts only once
        no open transaction holds offsets of it. The simulation runs one thread: such a
        transaction (its commit point ended inside one pass, so there is none in
        practice, but a timeout or a stall could leave one) is ended the way the
        coordinator ends it if its member does not, at `transaction.timeout.ms`: it is
        aborted, and its producer finds it abortable."""
        for producer in self.broker.producers:
            held = {tp for tp, _ in producer.txn_offsets}
            if producer.txn_open and held & tps:
                self.timed_out += 1
                producer.abortable = producer.abortable or _COORDINATOR_ABORTED

    def _moved_on(self) -> None:
        """Partitions revoked whose old owner has let them go (its revoke served, on
        its consumer or a replacement), or died: assigned to the new owner."""
        for tp, (old, new) in sorted(self.moving.items()):
            with self._as(old):
                held = tp in self.rig.consumer.assigned_tps and self.running
            if not held:
                del self.moving[tp]
                self._rebalanced({new: {tp}}, "revoked")

    def _consumer_turn(self) -> None:
        super()._consumer_turn()
        self._moved_on()

    # -- rules -------------------------------------------------------------------------
    @rule(
        data=st.data(),
        how=st.sampled_from(["revoke", "revoke", "revoke", "lost", "join"]),
        zombie_passes=st.integers(0, 2),
        new_owner_first=st.booleans(),
    )
    def rebalance(  # type: ignore[override]
        self, data: st.DataObject, how: str, zombie_passes: int, new_owner_first: bool
    ) -> None:
        """A partition drawn moves to the other member. `revoke`: the cooperative
        protocol's two rebalances, the old owner's revoke (its hand-over) at its next
        consumer turn (run at once), then the new owner's assignment. `lost`: the old
        owner's session expired; the group gives the partition to the new owner at once
        and the old one learns it at its next consumer turn, its forwarder running
        `zombie_passes` passes first, after the new owner's first turns or before.
        `join`: a third member joins and leaves, or the partition has no owner: the
        generation moves, and an unowned partition goes to a member drawn."""
        tp = data.draw(st.sampled_from(self.partitions), label="partition")
        old = self._owner(tp)
        if how == "join" or old is None or tp in self.moving:
            gains = {}
            if old is None and tp not in self.moving:
                gains = {data.draw(st.sampled_from(MEMBERS), label="to"): {tp}}
            self._rebalanced(gains, "assigned")
            return
        new = 1 - old
        with self._as(old):
            self.assignment.discard(tp)
            if how == "revoke":
                self.group.generation += 1
                self.rig.consumer.queue_rebalance("revoke", tp)
                self.moves.append((self.clock.time(), tp, "revoking"))
                self.moving[tp] = (old, new)
                with self._as(new):
                    self.rig.consumer.queue_rebalance("assign")
                self.threads_run(["consumer"])
                return
            self.rig.consumer.expire(tp)
        self._rebalanced({new: {tp}}, "lost")
        if new_owner_first:
            self.threads_run(["consumer", "forwarder"], member=new)
        with self._as(old):
            for _ in range(zombie_passes):
                self.clock.advance(0.1)
                self._forwarder_pass()

    @precondition(lambda self: self.processes <= RESTARTS)
    @rule(member=st.sampled_from(MEMBERS), landed=st.booleans())
    def killed_and_restarted(self, member: int, landed: bool) -> None:  # type: ignore[override]
        """The member's process dies at once (kill -9); what its producers had queued
        reached the broker (`landed`) or died with it. The group gives its partitions
        to the other member (once its session has expired: the time is not modelled),
        and the new process joins with none."""
        self.processes += 1
        other = 1 - member
        with self._as(member):
            self.faults.disarm()
            for producer in self.broker.producers:
                if landed and self.by_member.get(id(producer)) == member:
                    # Acknowledged, though no one is left to hear it.
                    raised_by(lambda producer=producer: producer.flush(0))
            gone = set(self.assignment) | {
                tp for tp, (_, new) in self.moving.items() if new == member
            }
            self.moving = {tp: m for tp, m in self.moving.items() if m[1] != member}
            self.assignment = set()
            self._start(assign=set())
        self._rebalanced({other: gone}, "killed")

    @rule(member=st.sampled_from(MEMBERS))
    def reader_pass(self, member: int | None = None) -> None:  # type: ignore[override]
        with self._as(self.member if member is None else member):
            super().reader_pass()

    @rule(member=st.sampled_from(MEMBERS), data=st.data())
    def reader_call_fails(self, member: int, data: st.DataObject) -> None:  # type: ignore[override]
        with self._as(member):
            if self.running:
                super().reader_call_fails(data)

    @precondition(lambda self: "stall" in self.shapes)
    @rule(
        member=st.sampled_from(MEMBERS),
        call=st.sampled_from(["get_watermark_offsets", "list_topics", "consume"]),
        world=st.sampled_from(["cancel", "reschedule"]),
        stall_s=st.sampled_from([2.0, 12.0, 40.0]),
    )
    def a_reader_call_stalls_while_markers_arrive(  # type: ignore[override]
        self, member: int, call: str, world: str, stall_s: float
    ) -> None:
        with self._as(member):
            if self.running:
                super().a_reader_call_stalls_while_markers_arrive(call, world, stall_s)

    @rule(member=st.sampled_from(MEMBERS), data=st.data())
    def topic_grows(self, member: int, data: st.DataObject) -> None:  # type: ignore[override]
        """The one-member rule, the added partition assigned to `member`: the other
        member rejoins too."""
        before = len(self.partitions)
        with self._as(member):
            super().topic_grows(data)
        if len(self.partitions) > before:
            added = self.partitions[-1]
            if self._owner(added) is not None:
                self.moves.append((self.clock.time(), added, "added"))
            self._rebalanced({}, "grown")

    @rule(seconds=st.sampled_from([0.01, 0.05, 0.2, 0.5, 1.0, 3.0]), reader=st.booleans())
    def time_passes(self, seconds: float, reader: bool) -> None:
        """Time passes while both members' threads run: each its reader pass (unless
        the readers lag), a consumer turn, a forwarder pass and a consumer turn."""
        self.clock.advance(seconds)
        for member in MEMBERS:
            with self._as(member):
                if reader:
                    super().reader_pass()
                self.threads_run(["consumer", "forwarder", "consumer"])

    @rule(
        member=st.sampled_from(MEMBERS),
        turns=st.lists(st.sampled_from(["consumer", "forwarder"]), min_size=1, max_size=4),
    )
    def threads_run(self, turns: list[str], member: int | None = None) -> None:  # type: ignore[override]
        with self._as(self.member if member is None else member):
            super().threads_run(turns)

    @rule(
        member=st.sampled_from(MEMBERS),
        client=st.sampled_from(["consumer", "producer"]),
        data=st.data(),
    )
    def next_call_fails(  # type: ignore[override]
        self, client: str, data: st.DataObject, member: int | None = None
    ) -> None:
        """The one-member rule, on `member`'s clients."""
        with self._as(self.member if member is None else member):
            if self.running:
                super().next_call_fails(client, data)

    @precondition(lambda self: "queue_full" in self.shapes)
    @rule(member=st.sampled_from(MEMBERS), data=st.data())
    def queue_fills_then_a_call_fails(self, member: int, data: st.DataObject) -> None:  # type: ignore[override]
        with self._as(member):
            if self.running:
                super().queue_fills_then_a_call_fails(data)

    @rule(member=st.sampled_from(MEMBERS), data=st.data(), forwarder_passes=st.integers(0, 2))
    def session_expires(  # type: ignore[override]
        self, member: int, data: st.DataObject, forwarder_passes: int
    ) -> None:
        """The one-member rule on `member` (half the time the partitions its open
        transaction holds records of), the partitions given to the other member at once."""
        with self._as(member):
            if not (self.running and self.assignment):
                return
            before = set(self.assignment)
            super().session_expires(data, forwarder_passes)
            gone = before - self.assignment
        for tp in gone:
            self.moves.append((self.clock.time(), tp, "expired"))
        self._rebalanced({1 - member: gone}, "lost")

    @rule(
        member=st.sampled_from(MEMBERS),
        data=st.data(),
        ahead_ms=st.sampled_from([1_500, 3_000, 6_000, 12_000]),
        forwarder_passes=st.integers(1, 2),
    )
    def a_move_made_ahead_meets_an_expired_session(  # type: ignore[override]
        self, member: int, data: st.DataObject, ahead_ms: int, forwarder_passes: int
    ) -> None:
        """Weighted, the one-member rule on `member`: a move made ahead in its open
        transaction, then its session expires and the other member takes the partitions
        (docs/cancel-and-reschedule.md, "A move and a change of owner")."""
        with self._as(member):
            if not (self.running and self.assignment and self.ids):
                return
            self._move_ahead(data, ahead_ms)
        self.session_expires(member, data, forwarder_passes)

    @precondition(lambda self: self.exactly_once and bool(self.ids) and self.processes <= RESTARTS)
    @rule(
        member=st.sampled_from(MEMBERS),
        data=st.data(),
        ahead_ms=st.sampled_from([1_500, 3_000, 6_000, 12_000]),
        wait_s=st.integers(1, 3),
    )
    def a_move_committed_ahead_of_its_answer_meets_a_restart(  # type: ignore[override]
        self, member: int, data: st.DataObject, ahead_ms: int, wait_s: int
    ) -> None:
        """Weighted, the one-member rule on `member`: the commit markers late, a move
        made ahead and committed, then the member killed, and the other member, given
        its partitions, runs `wait_s` seconds before the markers land."""
        self.commit_markers_late()
        with self._as(member):
            if not (self.running and self.assignment):
                return
            self._move_ahead(data, ahead_ms)
        self.time_passes(1.0, reader=True)  # its commit point
        self.killed_and_restarted(member, landed=False)
        for _ in range(wait_s):
            self.time_passes(1.0, reader=True)
        self.commit_markers_land()

    def _faults_stop(self) -> None:
        """Both members: nothing armed; the commit markers landed; every partition
        moving or unowned assigned (to member 0, which the group would give them to as
        to any)."""
        for member in MEMBERS:
            with self._as(member):
                self.faults.disarm()
        self.stall_world.clear()
        self.commit_markers_land()
        self.markers_partitions_catch_up()
        self.acks_resume()
        self._moved_on()
        unowned = {tp for tp in self.partitions if self._owner(tp) is None}
        unowned -= set(self.moving)
        if unowned:
            self._rebalanced({0: unowned}, "assigned")

    def _settling(self) -> bool:
        return all(self._alive(member) for member in MEMBERS) and not self.moving

    # -- invariants --------------------------------------------------------------------
    def promises_hold(self) -> None:
        super().promises_hold()
        self.forwarded_only_through_read_markers()
        self.twice_only_around_a_move()

    def no_wake_up_lost(self) -> None:
        for member in MEMBERS:
            with self._as(member):
                super().no_wake_up_lost()

    def no_purge_taken_for_a_failure(self) -> None:
        for member in MEMBERS:
            with self._as(member):
                super().no_purge_taken_for_a_failure()

    def every_thread_alive_or_reported(self) -> None:
        """Per member: a thread that ended reported why; the member's process is then
        started again, as the service manager would, and with static membership gets
        its partitions back (no rebalance)."""
        for member in MEMBERS:
            with self._as(member):
                self._check(
                    self.reader_alive,
                    f"member {member}: the marker reader's thread ended: {self.reader_death} "
                    f"(faults fired: {self.faults.log})",
                )
                if not self.running:
                    self._check(bool(self.rig.fatal), f"member {member}: a thread ended unreported")
                    self.fatal_reports.extend(self.rig.fatal)
                    self._start(assign=set(self.assignment))
        self._moved_on()

    def forwarded_only_through_read_markers(self) -> None:
        """A forward is produced only once its member's reader has read the markers of
        the record's partition through its due time less `cancel_lead` (the time a
        reschedule asked, when sooner: a record moved sooner goes then)."""
        for producer in self.broker.producers:
            for sent in producer.sent:
                noted = self.gate_at_send.get(id(sent))
                if noted is None:
                    continue
                member, through = noted
                asked = [ms for i, _, ms in self.reschedules if i == sent.delay_id]
                early = {
                    spot: (at, due)
                    for spot, at in through.items()
                    if at < (due := min([self.broker.due_ms[spot], *asked]))
                }
                self._check(
                    not through or len(early) < len(through),
                    f"FORWARDED BEFORE ITS MARKERS WERE READ: {sent.delay_id} by member "
                    f"{member} at {sent.at}: (markers read through, due) per record: {early}",
                )

    def twice_only_around_a_move(self) -> None:
        """At-least-once: a message both members sent had one of its records'
        partitions change owner before its last send."""
        if self.exactly_once:
            return
        sends: dict[str, dict[int, list[float]]] = {}
        for producer in self.broker.producers:
            member = self.by_member.get(id(producer))
            for sent in producer.visible():
                if member is None or sent.topic != TARGET:
                    continue
                sends.setdefault(sent.delay_id or "", {}).setdefault(member, []).append(sent.at)
        for message_id, by in sorted(sends.items()):
            if len(by) < len(MEMBERS):
                continue
            last = max(at for ats in by.values() for at in ats)
            tps = {spot[0] for spot in self.records.get(message_id, [])}
            around = [m for m in self.moves if m[1] in tps and m[0] <= last]
            self._check(
                bool(around),
                f"TWICE WITHOUT A MOVE: {message_id} was sent by both members ({by}), and "
                f"none of its partitions {sorted(tps)} changed owner before",
            )


@pytest.mark.timeout(300 + 2 * EXAMPLES)  # shrinking a failure takes up to five minutes
@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_two_level_members_keep_the_promises_as_partitions_move(
    exactly_once: bool, fast_path_impl: str
) -> None:
    examples = examples_on(fast_path_impl, CI_EXAMPLES)
    run_guarantee(TwoMemberSimulation, exactly_once, SEEDS, "TwoMember", examples=examples)


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
@pytest.mark.parametrize("how", ["revoke", "lost"])
def test_a_partition_moves_to_the_other_member_with_records_and_a_cancel_in_flight(
    exactly_once: bool, how: str
) -> None:
    """The rules written out: three records on member 0's partition, due in 4 s, read and
    queued by it; one cancelled, the cancel read by both readers; the partition moves to
    member 1 (revoked, or lost with a zombie pass of member 0's forwarder). Member 1
    sends the two others once each, after their due time, and not the cancelled one; the
    group's offset passes all three. Without this a random run that never reached a
    move would pass on nothing."""
    run = type("WrittenTwoMembers", (TwoMemberSimulation,), {"exactly_once": exactly_once})
    machine = run()
    machine.faults_of_this_run([False] * len(SHAPES))
    try:
        _time_passes(machine, 2)
        tp = (A, 0)
        assert machine._owner(tp) == 0
        machine.records_arrive(_Drawn(False, tp), 3, 4_000, b"k0")
        first, cancelled, last = machine.ids
        machine.time_passes(0.05, reader=True)
        with machine._as(0):
            assert machine.rig.consumer.positions[tp] == 3, "member 0 did not read them"
        machine.cancel_sent(_Drawn(False, cancelled))
        machine.time_passes(0.05, reader=True)
        machine.promises_hold()
        machine.rebalance(_Drawn(tp), how, 1, True)
        machine.promises_hold()
        _time_passes(machine, 2)
        assert machine._owner(tp) == 1, machine.moving
        assert any(moved == tp for _, moved, _ in machine.moves)
        _time_passes(machine, 6)
        sent = [
            (s.delay_id, machine.by_member[id(p)], s.at)
            for p in machine.broker.producers
            for s in p.visible(TARGET)
        ]
        assert sorted(i for i, _, _ in sent) == sorted([first, last]), sent
        assert {member for _, member, _ in sent} == {1}, sent
        assert all(at * 1000 >= machine.broker.due_ms[machine.ids[i]] for i, _, at in sent)
        assert machine.groups[machine.layout].get(tp) == 3
    finally:
        machine.teardown()


def test_written_a_copy_waits_for_the_markers_of_the_partition_its_id_names() -> None:
    """Found by the search (seed 4732, example 70 of 300, exactly-once): a message of the
    5 s level's partition 0 is moved ahead by member 0, its copy placed on a partition
    of another level whose markers go to another markers partition, while the markers
    partition of partition 0 is slow; member 1, given the copy's partition, forwarded it
    with its id's markers read only to 4 s before its due time. A cancel of the message
    appended there in time is not read yet, and the copy would go: a copy was gated on
    the markers of the partition it waits on, not those of the partition its id names,
    where its markers are."""
    run = type("WrittenTwoMembers", (TwoMemberSimulation,), {"exactly_once": True})
    machine = run()
    try:
        machine.faults_of_this_run([False] * 7 + [True, True], markers_partitions=2)
        machine.a_reader_call_stalls_while_markers_arrive(0, "get_watermark_offsets", "cancel", 2.0)
        machine.records_arrive(_Drawn(False, (A, 1)), 1, 0, b"k0")
        machine.a_while_passes(3)
        machine.markers_partition_slows(_Drawn((A, 0)), 50)
        machine.session_expires(0, _Drawn({(B, 0)}), 0)
        machine.reader_pass(0)
        machine.records_arrive(_Drawn(False, (A, 0)), 2, 50, b"k0")
        machine.markers_partitions_catch_up()
        moved = list(machine.ids)[-2]
        machine.a_move_made_ahead_meets_an_expired_session(
            0, _Drawn(False, moved, {(C, 1)}), 1_500, 1
        )
        machine.markers_partition_slows(_Drawn((A, 0)), 0)
        machine.a_while_passes(3)
    finally:
        machine.teardown()
