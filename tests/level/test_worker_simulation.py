"""A seeded simulation of the level worker (issue 47), in the way FoundationDB's
simulator and TigerBeetle's VOPR work, at this project's scale: hypothesis'
`RuleBasedStateMachine` steps one worker (its consumer loop and its forwarder, over
two levels and three partitions) on the faithful fakes, from the test's own thread,
and checks the promises after every step. What it models and what it leaves out:
docs/simulation.md.

The rules: records arrive; cancels are appended to the markers topic; time passes; one
turn of the consumer loop or one pass of the forwarder runs (each as its thread runs
it, errors handled as its loop handles them), or a pass of the marker reader; the next
call of a client fails with one error shape (`tests/simulation`); partitions are
assigned, revoked or lost; the process is killed and a new one starts from what the
fake broker holds (its marker reader reads the markers topic again from the start).

The invariants, after every step:
- no committed offset is above a record that was neither forwarded nor dead-lettered;
- nothing is forwarded before it is due;
- a cancel appended more than `cancel_lead` before its message's due time is honoured:
  the message is never forwarded (a cancel appended before the due time may withdraw
  it, so its offset may commit unsent);
- exactly-once: no record is in two committed transactions, and no transaction
  commits what its member did not own;
- each thread is alive, or its failure was reported (`on_fatal`, which stops the
  daemon: the simulation then restarts the process).

CI runs `EXAMPLES` seeded examples per guarantee; DELAYSERVICE_SIM_EXAMPLES asks for
more (`./scripts/test.sh --all`), DELAYSERVICE_SIM_SEED for another seed. A failure
prints the seed and hypothesis' shortest sequence of steps.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from delayservice.forward import dead_letter as dead_letter_module
from delayservice.forward import forwarder as forwarder_module
from delayservice.forward.sender import ForwarderFatalError
from delayservice.kafka import consumer_thread as consumer_thread_module
from delayservice.kafka.client_errors import raised_by
from delayservice.level import consumer_loop as consumer_loop_module
from delayservice.level.marker_verdict import LevelMarker
from delayservice.markers.level_ids import level_id
from delayservice.markers.replies import CANCEL
from tests.level import fakes
from tests.level.fakes import (
    LEVEL,
    LONGER,
    FakeClock,
    FakeConsumer,
    FakeProducer,
    LevelRig,
    _source_of,
    envelope_headers,
    make_level_rig,
    message,
)
from tests.simulation import (
    CONSUMER_CALLS,
    EXAMPLES,
    PRODUCER_CALLS,
    SHAPES,
    Broker,
    Faults,
    Simulation,
    can_fail,
    run_guarantee,
)

RESTARTS = 2
"""Kills per example (a reported failure's restart is not counted)."""
SEEDS = {False: 4701, True: 4702}
"""The seed of each guarantee's run (at-least-once, exactly-once), unless
DELAYSERVICE_SIM_SEED gives another."""

A, B = LEVEL.topic, LONGER.topic
PARTITIONS = ((A, 0), (A, 1), (B, 0))
DELAYS = {A: LEVEL.delay_ms, B: LONGER.delay_ms}
INDEX = {A: LEVEL.index, B: LONGER.index}
LEAD_MS = 1_000
"""`cancel_lead`: the default's."""
MARKERS = "delay_markers"
KEYS = (b"k0", b"k1", b"k2")


class LevelWorkerSimulation(Simulation):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self._patched = [
            (module, "time", module.time) for module in (dead_letter_module, consumer_loop_module)
        ]
        for module, name, _ in self._patched:
            setattr(module, name, self.clock)
        self.thread_deaths: list[str] = []
        """Helper threads that ended on an exception nobody caught (see `_died`)."""
        self._excepthook = threading.excepthook
        threading.excepthook = self._died
        self.broker = Broker()
        self.markers: list[LevelMarker] = []
        """The markers topic (one partition), in append order."""
        self.filed = 0
        """How many of them this process's marker reader has read."""
        self.ids: dict[str, tuple[tuple[str, int], int]] = {}
        """Level id -> the record it names (partition, offset)."""
        self.assignment: set[tuple[str, int]] = set()
        self.processes = 0
        self.fatal_reports: list[str] = []
        self.shapes: list[str] = list(SHAPES)
        self.rig: LevelRig
        self.faults: Faults
        self._start(assign=set(PARTITIONS))

    def _died(self, args: Any) -> None:
        """A helper thread (`Transaction._guarded` runs each transaction call in one)
        ended on an exception it did not catch: a bare `KafkaError` passes its
        `except BaseException`, and the caller then reports a call that "did not
        return" and replaces the producer. Noted, not failed: the forwarder goes on."""
        self.thread_deaths.append(f"{args.thread.name if args.thread else '?'}: {args.exc_value!r}")

    def teardown(self) -> None:
        threading.excepthook = self._excepthook
        for module, name, original in self._patched:
            setattr(module, name, original)

    # -- a process ---------------------------------------------------------------------
    def _start(self, assign: set[tuple[str, int]]) -> None:
        """A new process: a worker on fresh clients over what the broker holds."""
        self.faults = Faults()
        rig = make_level_rig(
            clock=self.clock,
            exactly_once=self.exactly_once,
            levels=(LEVEL, LONGER),
            backoff=(0.2, 2.0),
            give_up_s=30.0,
            high_water=6,
            low_water=2,
            markers=True,
            cancel_lead_ms=LEAD_MS,
        )
        assert rig.markers is not None
        rig.markers.gate.start(0)  # a new reader reads the markers topic from its start
        self.filed = 0
        self.broker.attach(rig.consumer)
        self.faults.wrap_consumer(rig.consumer)
        self.faults.wrap_producer(rig.producer)
        self.broker.producers.append(rig.producer)
        config = rig.producer.config

        def new_producer() -> FakeProducer:
            producer = FakeProducer(dict(rig.producer.topics), self.clock, config)
            producer.owner = self.rig.consumer
            fakes.PRODUCERS.append(producer)
            self.broker.producers.append(producer)
            return self.faults.wrap_producer(producer)

        def new_consumer(config: dict[str, Any]) -> FakeConsumer:
            """A consumer replacing one that failed: it joins the group and is given
            what the group assigns this member."""
            consumer = FakeConsumer(A, B)
            consumer.make(config)
            self.broker.attach(consumer)
            self.faults.wrap_consumer(consumer)
            for producer in self.broker.producers:
                producer.owner = consumer
            self.rig.consumer = consumer
            if self.assignment:
                consumer.queue_rebalance("assign", *sorted(self.assignment))
            return consumer

        rig.forwarder._make_producer = new_producer
        rig.loop.keeper._make = new_consumer
        rig.loop._subscribe()
        self.rig = rig
        self.consumer_alive = True
        self.forwarder_alive = True
        self.assignment = set(assign)
        if self.assignment:
            rig.consumer.queue_rebalance("assign", *sorted(self.assignment))

    @property
    def running(self) -> bool:
        return self.consumer_alive and self.forwarder_alive

    # -- rules -------------------------------------------------------------------------
    @rule(
        tp=st.sampled_from(PARTITIONS),
        count=st.integers(1, 3),
        due_in_ms=st.sampled_from([0, 0, 50, 400, 1_500, 4_000]),
        key=st.sampled_from(KEYS),
    )
    def records_arrive(self, tp: tuple[str, int], count: int, due_in_ms: int, key: bytes) -> None:
        stamp = self.clock.ms() - DELAYS[tp[0]] + due_in_ms
        log = self.broker.logs.setdefault(tp, [])
        for _ in range(count):
            offset = len(log)
            message_id = level_id(INDEX[tp[0]], tp[1], stamp)
            self.ids[message_id] = (tp, offset)
            headers = envelope_headers(message_id=message_id, delay_ms=DELAYS[tp[0]])
            record = message(
                tp[1], offset, stamp, topic=tp[0], key=key, value=b"v%d" % offset, headers=headers
            )
            log.append(record)
            self.broker.due_ms[(tp, offset)] = stamp + DELAYS[tp[0]]

    @precondition(lambda self: bool(self.ids))
    @rule(data=st.data())
    def cancel_sent(self, data: st.DataObject) -> None:
        """An application cancels a message it sent: acknowledged at once by the broker
        (appended now), read by the daemon's marker reader on its next pass."""
        now = self.clock.ms()
        pending = [i for i, spot in self.ids.items() if self.broker.due_ms[spot] > now]
        message_id = data.draw(st.sampled_from(sorted(pending or self.ids)), label="cancelled")
        marker = LevelMarker(CANCEL, message_id, self.clock.ms(), MARKERS, 0, len(self.markers))
        self.markers.append(marker)

    @rule()
    def reader_pass(self) -> None:
        """One pass of the marker reader (its own thread): it files what was appended
        since its last pass, serves a rewind a partition asked for (it holds every
        marker from the start), and moves the gate to the time the pass began."""
        markers = self.rig.markers
        assert markers is not None
        began = self.clock.ms()
        for marker in self.markers[self.filed :]:
            markers.book.file(marker)
        self.filed = len(self.markers)
        markers.gate.take_rewind()
        markers.gate.advance(began, began, markers.gate.generation)

    @rule(seconds=st.sampled_from([0.01, 0.05, 0.2, 0.5, 1.0, 3.0]), reader=st.booleans())
    def time_passes(self, seconds: float, reader: bool) -> None:
        """Time passes while the threads run: a reader pass unless the reader lags, a
        consumer turn, a forwarder pass and a consumer turn after it (`threads_run`
        interleaves them otherwise)."""
        self.clock.advance(seconds)
        if reader:
            self.reader_pass()
        self.threads_run(["consumer", "forwarder", "consumer"])

    @precondition(lambda self: self.running)
    @rule(turns=st.lists(st.sampled_from(["consumer", "forwarder"]), min_size=1, max_size=4))
    def threads_run(self, turns: list[str]) -> None:
        """Turns of the consumer loop and passes of the forwarder, in this order."""
        for turn in turns:
            if not self.running:
                return
            if turn == "consumer":
                self._consumer_turn()
            else:
                self._forwarder_pass()

    def _consumer_turn(self) -> None:
        """One turn of `ConsumerThread._loop`, as its thread runs it."""
        loop, keeper = self.rig.loop, self.rig.loop.keeper
        going: list[bool] = []
        raised = raised_by(lambda: going.append(loop._turn(keeper)))
        if going == [False] or (raised is not None and not loop._failed(keeper, raised)):
            self.consumer_alive = False

    def _forwarder_pass(self) -> None:
        """One pass of `Forwarder._run`, as its thread runs it (a commit point when one
        is due by the clock)."""
        raised = raised_by(self.rig.forwarder.step)
        if isinstance(raised, ForwarderFatalError):  # `_main` reports it and ends
            self.rig.fatal.append(str(raised))
            self.forwarder_alive = False

    @initialize(switched_on=st.lists(st.booleans(), min_size=len(SHAPES), max_size=len(SHAPES)))
    def faults_of_this_run(self, switched_on: list[bool]) -> None:
        """Swarm testing: each example injects about half the shapes (in `SHAPES`'
        order), not all of them, so that two faults that must meet (a full queue, then
        an error from the poll that waits for room) meet often."""
        self.shapes = [shape for shape, on in zip(SHAPES, switched_on, strict=True) if on]
        self.shapes = self.shapes or ["retriable"]

    @precondition(lambda self: self.running)
    @rule(client=st.sampled_from(["consumer", "producer"]), data=st.data())
    def next_call_fails(self, client: str, data: st.DataObject) -> None:
        """The next call of `client` that can fail with the shape drawn fails, or the
        next call of one method drawn: a fault armed for any call is taken by the first
        (consume() comes first in every turn of the consumer loop), so a method is drawn
        half the time to reach what runs after it in the same turn."""
        shape = data.draw(st.sampled_from(self.shapes), label="shape")
        if client == "consumer" and shape == "queue_full":
            shape = "timeout"
        calls = [c for c in (CONSUMER_CALLS if client == "consumer" else PRODUCER_CALLS)]
        calls = [c for c in calls if can_fail(c, shape)]
        call = data.draw(st.one_of(st.none(), st.sampled_from(calls)), label="call")
        self.faults.arm(client, shape, call)

    @precondition(lambda self: self.running)
    @rule(
        kind=st.sampled_from(["assign", "revoke", "lost"]),
        which=st.sets(st.sampled_from(PARTITIONS), min_size=1),
    )
    def rebalance(self, kind: str, which: set[tuple[str, int]]) -> None:
        chosen = which - self.assignment if kind == "assign" else which & self.assignment
        if not chosen:
            return
        if kind == "assign":
            self.assignment |= chosen
        else:
            self.assignment -= chosen
        self.rig.consumer.queue_rebalance(kind, *sorted(chosen))

    @precondition(lambda self: self.processes <= RESTARTS)
    @rule()
    def killed_and_restarted(self) -> None:
        """The process dies (or stopped after a reported failure); a new one starts and
        is assigned every partition, from the offsets the broker holds."""
        self.processes += 1
        self._start(assign=set(PARTITIONS))

    # -- invariants --------------------------------------------------------------------
    @invariant()
    def promises_hold(self) -> None:
        self.nothing_committed_past_a_record_not_sent()
        self.nothing_forwarded_early()
        self.every_cancel_in_time_honoured()
        self.exactly_once_commits_each_record_once()
        self.every_thread_alive_or_reported()

    def _seen(self) -> list[tuple[tuple[str, int], int, float]]:
        """(partition, offset, when sent) of each forward or dead letter a reader sees
        (read_committed in exactly-once), through every producer of every process."""
        out = []
        for producer in self.broker.producers:
            for sent in producer.visible():
                source = _source_of(sent) or self.ids.get(sent.delay_id or "")
                if source is not None:
                    out.append((source[0], source[1], sent.at))
        return out

    def _cancelled_before(self, lead_ms: int) -> set[tuple[tuple[str, int], int]]:
        """Records with a cancel appended more than `lead_ms` before their due time."""
        out = set()
        for marker in self.markers:
            tp, offset = self.ids[marker.message_id]
            if marker.appended_ms < self.broker.due_ms[(tp, offset)] - lead_ms:
                out.add((tp, offset))
        return out

    def nothing_committed_past_a_record_not_sent(self) -> None:
        seen = {(tp, offset) for tp, offset, _ in self._seen()}
        withdrawn = self._cancelled_before(0)
        for tp, upto in sorted(self.broker.committed.items()):
            missing = [o for o in range(upto) if (tp, o) not in seen | withdrawn]
            self._check(
                not missing,
                f"LOSS: {tp[0]}[{tp[1]}] committed at {upto} but records {missing} were "
                f"neither forwarded nor dead-lettered (faults fired: {self.faults.log})",
            )

    def nothing_forwarded_early(self) -> None:
        for tp, offset, at in self._seen():
            due = self.broker.due_ms[(tp, offset)]
            self._check(at * 1000 >= due - 0.001, f"EARLY: {tp}@{offset} sent at {at}, due {due}")

    def every_cancel_in_time_honoured(self) -> None:
        seen = {(tp, offset) for tp, offset, _ in self._seen()}
        leaked = sorted(seen & self._cancelled_before(LEAD_MS))
        self._check(not leaked, f"CANCEL LEAKED: forwarded though cancelled in time: {leaked}")

    def exactly_once_commits_each_record_once(self) -> None:
        if not self.exactly_once:
            return
        counts = Counter((tp, offset) for tp, offset, _ in self._seen())
        twice = sorted(spot for spot, n in counts.items() if n > 1)
        self._check(not twice, f"DUPLICATE in committed transactions: {twice}")
        violations = [v for p in self.broker.producers for v in p.violations]
        self._check(
            not violations, f"a transaction committed what its member did not own: {violations}"
        )

    def every_thread_alive_or_reported(self) -> None:
        if not self.running:
            self._check(bool(self.rig.fatal), "a thread ended without reporting why")
            self.fatal_reports.extend(self.rig.fatal)
            self._start(assign=set(PARTITIONS))  # the daemon stops; a new one starts


@pytest.fixture(autouse=True)
def _no_real_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loops' pauses after an error are real waits on an event; a step is one pass."""
    monkeypatch.setattr(consumer_thread_module, "ERROR_PAUSE_S", 0.0)
    monkeypatch.setattr(consumer_loop_module, "STABLE_RETRY_S", 0.0)
    monkeypatch.setattr(forwarder_module, "RESEEK_POLL_S", 0.0)


@pytest.mark.timeout(300 + EXAMPLES)  # shrinking a failure takes up to five minutes
@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_the_level_worker_keeps_its_promises_under_every_fault(exactly_once: bool) -> None:
    run_guarantee(LevelWorkerSimulation, exactly_once, SEEDS, "")
