"""A seeded simulation of the precise worker (issue 47), the level worker's
(`tests/level/test_worker_simulation.py`) over the same error shapes and fake broker
(`tests/simulation.py`): hypothesis' `RuleBasedStateMachine` steps one `PreciseWorker`,
wired as the daemon wires it (intake, wheel, slot files in a real data directory,
forwarder; exactly-once, the delivery log on the done topic), from the test's own
thread, and checks the promises after every step. What it models and what it leaves
out: docs/simulation.md.

The rules: records arrive on the precise topic (due now or up to 12 s out, beyond the
wheel's lookahead, so some wait in slot files; now and then one without a valid
envelope, for the intake's dead letters); a cancel of one of them arrives on its
partition, in time or not (while the intake waits for the transaction carrying its
answer, the forwarder runs: `_WhileTheIntakeWaits`); a reschedule of one arrives there,
sooner or later, in time or not; time passes; one turn of the
intake, one pass of the wheel's loader or one pass of the forwarder runs (each as its
thread runs it, errors handled as its loop handles them); the next call of the
intake's consumer or of the forwarder's producer fails with one error shape; the
process is killed and a new one starts from what the fake broker and the data
directory hold.

The invariants, after every step:
- no committed intake offset is above a record that is neither forwarded or
  dead-lettered (as a reader of the targets sees them, read_committed in exactly-once)
  nor held unsettled in a slot file of the data directory;
- nothing is forwarded before it is due (before its new time, when a reschedule came at
  least `cancel_lead` before its due time);
- a record whose cancel was appended at least `cancel_lead` before its due time is never
  forwarded, nor a copy of it (and after a quiet minute every cancel and reschedule is
  answered: in time, `accepted` and `moved`);
- exactly-once: no record is in two committed transactions;
- each thread is alive, or its failure was reported (`on_fatal`: the simulation then
  starts a new process, as the service manager would).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from confluent_kafka import Message, TopicPartition
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule
from prometheus_client import CollectorRegistry

from delayservice.envelope import (
    H_CANCEL,
    H_DELAY_MS,
    H_DUE_MS,
    H_RESCHEDULE,
    H_VERSION,
    VERSION,
    Envelope,
)
from delayservice.forward import dead_letter as dead_letter_module
from delayservice.forward import forwarder as forwarder_module
from delayservice.forward.send_errors import ForwarderFatalError
from delayservice.kafka import consumer_thread as consumer_thread_module
from delayservice.kafka.client_errors import raised_by
from delayservice.kafka.consumer_keeper import ConsumerKeeper
from delayservice.markers.replies import reply_key
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.precise import precise_worker as precise_worker_module
from delayservice.precise.delivery import delivery_log as delivery_log_module
from delayservice.precise.intake import admission as admission_module
from delayservice.precise.intake import intake as intake_module
from delayservice.precise.precise_worker import PreciseWorker
from delayservice.precise.storage.slot_file import decode
from delayservice.precise.wheel import read_through as read_through_module
from delayservice.precise.wheel import slot_loading as slot_loading_module
from delayservice.settings import Settings
from delayservice.settings_loading import load_settings
from tests.level.fakes import (
    DLQ,
    TARGET,
    FakeClock,
    FakeConsumer,
    FakeProducer,
    _source_of,
    message,
)
from tests.precise.txn_fakes import DoneReader, FakeCoordinator, FencingProducer
from tests.simulation import (
    EXAMPLES,
    SHAPES,
    STALLS_S,
    Broker,
    Faults,
    Simulation,
    refused_for_state,
    run_guarantee,
)

TOPIC = "timers"
"""The precise topic (ids `id-timers-P-O`: `_source_of` finds each forward's record)."""
PARTITIONS = (0, 1)
RESTARTS = 2
MOVES = 3
"""Reschedules of one record at most: a copy moved again, and again."""
"""Kills per example (a reported failure's restart is not counted)."""
SEEDS = {False: 4711, True: 4712}
"""The seed of each guarantee's run (at-least-once, exactly-once), unless
DELAYSERVICE_SIM_SEED gives another."""
LOOKAHEAD_S = 2.0
SETTLE_ROUNDS = 20
"""`faults_stop_and_time_passes`: rounds of 3 s (past the forwarder's backoff and give-up)."""


class ClockedDoneReader(DoneReader):
    """The delivery log's read_committed reader of the done topic: an empty read moves
    the fake clock by its timeout, as a real one waits (the log reads to a deadline)."""

    def __init__(self, coordinator: FakeCoordinator, topic: str, clock: FakeClock) -> None:
        super().__init__(coordinator, topic)
        self.clock = clock

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        out = super().consume(num_messages, 0)
        if not out and timeout > 0:
            self.clock.advance(timeout)
        return out


class FakeAdmin:
    """The read-through rounds' admin client: where each partition of the precise topic
    begins and ends, answered at once from the fake broker's logs."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def list_topics(self, topic: str, timeout: float = -1) -> Any:
        partitions = {p: SimpleNamespace(id=p) for p in PARTITIONS}
        return SimpleNamespace(topics={topic: SimpleNamespace(partitions=partitions)})

    def list_offsets(self, asked: dict[TopicPartition, Any], **_: Any) -> dict[Any, Future[Any]]:
        out: dict[Any, Future[Any]] = {}
        for tp, spec in asked.items():
            end = len(self.broker.logs.get((tp.topic, tp.partition), []))
            future: Future[Any] = Future()
            latest = type(spec).__name__ == "LatestSpec"
            future.set_result(SimpleNamespace(offset=end if latest else 0))
            out[tp] = future
        return out


class _WhileTheIntakeWaits(threading.Event):
    """The intake's wait for the transaction carrying its marker replies
    (`DeliveryLog.answer`), stepped: the forwarder's thread runs a pass meanwhile, and
    the clock moves by the wait. Without it the wait, made from the one thread that
    steps them all, would never end."""

    def __init__(self, simulation: PreciseWorkerSimulation) -> None:
        super().__init__()
        self._simulation = simulation

    def wait(self, timeout: float | None = None) -> bool:
        if not self.is_set() and timeout:
            self._simulation.clock.advance(timeout)
            if self._simulation.forwarder_alive:
                self._simulation._forwarder_pass()
        return self.is_set()


class _Drawn:
    """A `data` argument for a rule called by hand: every draw gives `value`."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def draw(self, _strategy: Any, label: str | None = None) -> Any:
        return self.value


class PreciseWorkerSimulation(Simulation):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.root = Path(tempfile.mkdtemp(prefix="precise-sim-"))
        self._patched: list[tuple[Any, str, Any]] = []
        for module in (
            intake_module,
            admission_module,
            dead_letter_module,
            delivery_log_module,
            read_through_module,
            slot_loading_module,
        ):
            self._patch(module, "time", self.clock)
        self._patch(precise_worker_module, "Consumer", self._new_consumer)
        simulation = self

        @dataclass
        class SteppedReplies(delivery_log_module._Replies):
            done: threading.Event = field(default_factory=lambda: _WhileTheIntakeWaits(simulation))

        self._patch(delivery_log_module, "_Replies", SteppedReplies)
        self._patch(precise_worker_module, "AdminClient", lambda _config: FakeAdmin(self.broker))
        self.thread_deaths: list[str] = []
        self._excepthook = threading.excepthook
        threading.excepthook = self._died
        self.broker = Broker()
        self.coordinator = FakeCoordinator()
        self.processes = 0
        self.fatal_reports: list[str] = []
        self.shapes: list[str] = list(SHAPES)
        self.worker: PreciseWorker | None = None
        self.answer_producers: list[FakeProducer] = []
        self.cancelled: dict[tuple[tuple[str, int], int], int] = {}
        """Record -> when a cancel of it was appended (epoch ms)."""
        self.markers: dict[tuple[tuple[str, int], int], tuple[tuple[str, int], int]] = {}
        """Where each cancel marker is (a record of the precise topic, never forwarded)
        -> the record it cancels."""
        self.moved: dict[tuple[tuple[str, int], int], list[tuple[int, int, int]]] = {}
        """Record -> its reschedules in log order: (when appended and the new due time,
        epoch ms; the marker's offset)."""
        self.moves: dict[tuple[tuple[str, int], int], tuple[tuple[str, int], int]] = {}
        """Where each reschedule marker is -> the record it moves."""
        self.order: dict[tuple[str, tuple[tuple[str, int], int]], int] = {}
        """(kind, record) -> the offset of its first marker of that kind: which of a
        record's markers came first (two may share a millisecond)."""
        self.invalid: set[tuple[tuple[str, int], int]] = set()
        """Records without a valid envelope (dead-lettered: nothing to move)."""
        self.faults = Faults(self.clock)
        self.fatal: list[str] = []
        self.keeper: ConsumerKeeper | None = None
        self._wire()
        self._start()

    def _wire(self) -> None:
        """More patches before the first process starts (a simulation built on this)."""

    def _patch(self, module: Any, name: str, value: Any) -> None:
        self._patched.append((module, name, getattr(module, name)))
        setattr(module, name, value)

    def _died(self, args: Any) -> None:
        self.thread_deaths.append(f"{args.thread.name if args.thread else '?'}: {args.exc_value!r}")

    def teardown(self) -> None:
        threading.excepthook = self._excepthook
        for module, name, original in reversed(self._patched):
            setattr(module, name, original)
        if self.worker is not None:
            self.worker.disk.close()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- a process ---------------------------------------------------------------------
    def _settings(self) -> Settings:
        return load_settings(
            levels="1s",
            precise=True,
            precise_topic=TOPIC,
            data_dir=self._data_dir(),
            dead_letter_topic=DLQ,
            guarantee="exactly-once" if self.exactly_once else "at-least-once",
            retry_backoff_s=0.2,
            retry_backoff_max_s=2.0,
            retry_give_up_s=30.0,
            precise_lookahead_s=LOOKAHEAD_S,
            **self._more_settings(),
        )

    def _data_dir(self) -> Path:
        return self.root

    def _more_settings(self) -> dict[str, Any]:
        """Settings a simulation built on this one adds (two copies, ...)."""
        return {}

    def _start(self) -> None:
        """A new process over the data directory and what the broker holds. The one
        before is gone at once: nothing it held in memory survives, what it wrote to
        its files does (a kill, not a power cut)."""
        if self.worker is not None:
            self.faults.disarm()
            self.worker.disk.close()
            for log in (self.worker.delivery, self.worker.copies_log):
                if log is not None:
                    log.close()
        self.faults = Faults(self.clock)
        self.fatal = []
        self.settings = settings = self._settings()
        self._lead_ms = settings.cancel_lead_ms
        self.topics = {
            TARGET: 3,
            DLQ: 1,
            settings.precise_done_topic: 1,
            settings.precise_outcomes_topic: 1,
        }
        answers = self._answer_producer()
        self.answer_producers.append(answers)
        self.worker = PreciseWorker(
            settings,
            ServiceMetrics(CollectorRegistry()),
            answers,
            self.fatal.append,
            make_producer=self._new_producer,
            clock=self.clock,
        )
        self.keeper = None
        self.intake_alive = self.loader_alive = self.forwarder_alive = True

    def _answer_producer(self) -> FakeProducer:
        """The process's producer of replies to markers (at-least-once's) and, with two
        copies, of progress reports."""
        return FakeProducer(dict(self.topics), self.clock)

    def _new_producer(self, config: dict[str, Any]) -> FakeProducer:
        producer: FakeProducer
        if "transactional.id" in config:
            producer = FencingProducer(self.coordinator, dict(self.topics), self.clock, config)
        else:
            producer = FakeProducer(dict(self.topics), self.clock, config)
        self.broker.producers.append(producer)
        return self.faults.wrap_producer(producer)

    def _new_consumer(self, config: dict[str, Any]) -> Any:
        """`Consumer` as the worker makes it: the delivery log's (or, with two copies,
        the progress reader's) reader of the done topic, or the intake's consumer of
        the precise topic (assigned, not subscribed; a replaced one is a new client on
        the same broker)."""
        if str(config.get("group.id", "")).endswith(("-delivered", "-progress")):
            reader = ClockedDoneReader(
                self.coordinator, self.settings.precise_done_topic, self.clock
            )
            reader.isolation = config.get("isolation.level", "read_committed")
            return reader
        consumer = FakeConsumer(TOPIC)
        consumer.make(config)
        consumer.manual = True
        consumer.partition_counts = {TOPIC: len(PARTITIONS)}
        self.broker.attach(consumer)
        return self.faults.wrap_consumer(consumer)

    @property
    def running(self) -> bool:
        return self.intake_alive and self.loader_alive and self.forwarder_alive

    # -- rules -------------------------------------------------------------------------
    @rule(
        partition=st.sampled_from(PARTITIONS),
        count=st.integers(1, 3),
        delay_ms=st.sampled_from([0, 0, 300, 1_500, 4_000, 12_000]),
        valid=st.sampled_from([True, True, True, True, True, False]),
    )
    def records_arrive(self, partition: int, count: int, delay_ms: int, valid: bool) -> None:
        """Records appended to the precise topic now, due `delay_ms` from now (one
        without a target when not `valid`: the intake dead-letters it)."""
        tp = (TOPIC, partition)
        log = self.broker.logs.setdefault(tp, [])
        stamp = self.clock.ms()
        for _ in range(count):
            offset = len(log)
            mid = f"id-{TOPIC}-{partition}-{offset}"
            headers = Envelope(TARGET if valid else "", delay_ms, mid).headers()
            log.append(
                message(
                    partition, offset, stamp, topic=TOPIC, headers=headers, value=b"v%d" % offset
                )
            )
            self.broker.due_ms[(tp, offset)] = stamp + delay_ms
            if not valid:
                self.invalid.add((tp, offset))

    @rule(data=st.data())
    def a_cancel_arrives(self, data: st.DataObject) -> None:
        """A cancel of a record appended before, as `DelayProducer.cancel` writes it: on
        the partition its id is on. Drawn among the records not cancelled yet, due or
        not: some come in time (at least `cancel_lead` before the due time), some
        close to it or after it."""
        choices = sorted(spot for spot in self.broker.due_ms if spot not in self.cancelled)
        if not choices:
            return
        spot = data.draw(st.sampled_from(choices), label="cancelled")
        tp, offset = spot
        log = self.broker.logs[tp]
        headers = [
            (H_VERSION, str(VERSION).encode()),
            (H_CANCEL, f"id-{TOPIC}-{tp[1]}-{offset}".encode()),
        ]
        stamp = self.clock.ms()
        marker = message(tp[1], len(log), stamp, topic=TOPIC, headers=headers, key=None, value=None)
        self.markers[(tp, len(log))] = spot
        log.append(marker)
        self.cancelled[spot] = stamp
        self.order[("cancel", spot)] = len(log) - 1

    @rule(
        data=st.data(),
        shift_ms=st.sampled_from([-4_000, -1_000, 0, 300, 1_500, 4_000, 12_000]),
        pending=st.sampled_from([True, True, True, False]),
    )
    def a_reschedule_arrives(self, data: st.DataObject, shift_ms: int, pending: bool) -> None:
        """A reschedule of a record appended before, to `shift_ms` from the time it was
        last asked for (not before now), as `DelayProducer.reschedule(deliver_at=...)`
        writes it: on the record's partition. Up to `MOVES` per record, so a copy is
        moved again; cancelled or not (the cancel wins, in either order). Mostly of a
        record not due within `cancel_lead` whichever of its times holds (`pending`), so
        that moves in time, later and sooner, are common; else of any, in time or not."""
        now_ms = self.clock.ms()
        choices = sorted(
            spot
            for spot in self.broker.due_ms
            if len(self.moved.get(spot, ())) < MOVES
            and (not pending or min(self._possible_dues(spot)) - now_ms >= self._lead_ms)
        )
        if not choices:
            return
        spot = data.draw(st.sampled_from(choices), label="moved")
        tp, offset = spot
        asked_ms = self.moved[spot][-1][1] if spot in self.moved else self.broker.due_ms[spot]
        new_due = max(now_ms, asked_ms + shift_ms)
        log = self.broker.logs[tp]
        headers = [
            (H_VERSION, str(VERSION).encode()),
            (H_RESCHEDULE, f"id-{TOPIC}-{tp[1]}-{offset}".encode()),
            (H_DELAY_MS, str(new_due - now_ms).encode()),
            (H_DUE_MS, str(new_due).encode()),
        ]
        marker = message(
            tp[1], len(log), now_ms, topic=TOPIC, headers=headers, key=None, value=None
        )
        self.moves[(tp, len(log))] = spot
        self.moved.setdefault(spot, []).append((now_ms, new_due, len(log)))
        self.order.setdefault(("reschedule", spot), len(log))
        log.append(marker)

    @rule(data=st.data(), shift_ms=st.sampled_from([-1_000, 1_500, 4_000]))
    def a_cancel_then_a_reschedule_arrive(self, data: st.DataObject, shift_ms: int) -> None:
        """Weighted: a record due at least `cancel_lead` from now is cancelled and then
        moved (two clients, or one that changed its mind): the cancel wins, and the
        move is answered `cancelled` and makes no copy. The two rules alone draw this
        order for one record too seldom to reach it."""
        now_ms = self.clock.ms()
        choices = sorted(
            spot
            for spot, due in self.broker.due_ms.items()
            if spot not in self.cancelled
            and spot not in self.moved
            and due - now_ms >= self._lead_ms
        )
        if not choices:
            return
        drawn = _Drawn(data.draw(st.sampled_from(choices), label="cancelled, then moved"))
        self.a_cancel_arrives(drawn)  # type: ignore[arg-type]
        self.a_reschedule_arrives(drawn, shift_ms, pending=True)  # type: ignore[arg-type]

    def _possible_dues(
        self, spot: tuple[tuple[str, int], int], before: int | None = None
    ) -> set[int]:
        """The times `spot` may be due at, after its reschedules (those at offsets below
        `before`, if given): a reschedule appended at least `cancel_lead` before a time
        replaces it; one closer, or after it, may have been read in time or not (the
        record may even be sent), so it adds its new time beside the old."""
        dues = {self.broker.due_ms[spot]}
        for at, new_due, offset in self.moved.get(spot, ()):
            if before is not None and offset >= before:
                break
            late = {due for due in dues if due - at < self._lead_ms}
            dues = late | {new_due}
        return dues

    def _move_in_time(self, spot: tuple[tuple[str, int], int], offset: int) -> bool:
        """Whether the reschedule at `offset` came at least `cancel_lead` before every
        time its record may have been due at then."""
        at = next(at for at, _, moved_at in self.moved[spot] if moved_at == offset)
        return min(self._possible_dues(spot, before=offset)) - at >= self._lead_ms

    def _earliest_ms(self, spot: tuple[tuple[str, int], int]) -> int:
        """The earliest `spot` may be forwarded: the last time a reschedule in time
        asked for; the sooner of the times after one that came late."""
        return min(self._possible_dues(spot))

    def _latest_ms(self, spot: tuple[tuple[str, int], int]) -> int:
        """By when `spot` is due whichever of its times holds."""
        return max(self._possible_dues(spot))

    @rule(seconds=st.sampled_from([0.01, 0.05, 0.2, 0.5, 1.0, 3.0]))
    def time_passes(self, seconds: float) -> None:
        """Time passes while the threads run: an intake turn, a loader pass, a forwarder
        pass and an intake turn (`threads_run` interleaves them otherwise)."""
        self.clock.advance(seconds)
        self.threads_run(["intake", "loader", "forwarder", "intake"])

    @precondition(lambda self: self.running)
    @rule(
        turns=st.lists(st.sampled_from(["intake", "loader", "forwarder"]), min_size=1, max_size=4)
    )
    def threads_run(self, turns: list[str]) -> None:
        for turn in turns:
            if not self.running:
                return
            {"intake": self._intake_turn, "loader": self._loader_pass}.get(
                turn, self._forwarder_pass
            )()

    def _intake_turn(self) -> None:
        """One turn of the intake's loop (`ConsumerThread._main` and `_loop`), as its
        thread runs it."""
        worker = self.worker
        assert worker is not None
        intake = worker.intake
        if self.keeper is None:
            opened: list[ConsumerKeeper] = []
            raised = raised_by(lambda: opened.append(intake._open()))
            if raised is not None:
                self.fatal.append(f"the consumer could not start: {raised}")
                self.intake_alive = False
                return
            self.keeper = opened[0]
        keeper = self.keeper
        going: list[bool] = []
        raised = raised_by(lambda: going.append(intake._turn(keeper)))
        if (
            going == [False]
            or (raised is not None and not intake._failed(keeper, raised))
            or intake._stopping.is_set()
        ):
            self.intake_alive = False

    def _loader_pass(self) -> None:
        """One pass of the wheel's loader (`Wheel._run`): slots now in reach come into
        memory, the settled marks are written."""
        wheel = self.worker.wheel  # type: ignore[union-attr]

        def step() -> None:
            wheel._loader.load_due_slots()
            wheel.write_marks()

        if not wheel._survived("loader", step):
            self.loader_alive = False

    def _forwarder_pass(self) -> None:
        """One pass of `Forwarder._run`, as its thread runs it (a commit point when one
        is due by the clock)."""
        if not self._survives_a_pass(self.worker.forwarder):  # type: ignore[union-attr]
            self.forwarder_alive = False

    def _survives_a_pass(self, forwarder: Any) -> bool:
        """One pass of `forwarder`; False once it failed for good (reported)."""
        raised = raised_by(forwarder.step)
        if isinstance(raised, ForwarderFatalError):  # `_main` reports it and ends
            self.fatal.append(str(raised))
            return False
        return True

    @initialize(switched_on=st.lists(st.booleans(), min_size=len(SHAPES), max_size=len(SHAPES)))
    def faults_of_this_run(self, switched_on: list[bool]) -> None:
        """Swarm testing, as the level worker's: about half the shapes per example."""
        self.shapes = [shape for shape, on in zip(SHAPES, switched_on, strict=True) if on]
        self.shapes = self.shapes or ["retriable"]

    @precondition(lambda self: self.running)
    @rule(client=st.sampled_from(["consumer", "producer"]), data=st.data())
    def next_call_fails(self, client: str, data: st.DataObject) -> None:
        shape = data.draw(st.sampled_from(self.shapes), label="shape")
        if client == "consumer" and shape == "queue_full":
            shape = "timeout"
        stall_s = data.draw(st.sampled_from(STALLS_S), label="stall_s") if shape == "stall" else 0
        self.faults.arm(client, shape, stall_s=stall_s)

    @precondition(lambda self: self.running and "queue_full" in self.shapes)
    @rule(data=st.data())
    def queue_fills_then_a_call_fails(self, data: st.DataObject) -> None:
        """Weighted: the producer's queue fills, and from then its next call that can
        fail (the poll of the wait for room, often) fails with another shape. The two must meet
        to reach the put-back of what a send took, and `next_call_fails` alone draws
        them in that order too seldom."""
        then = [shape for shape in self.shapes if shape != "queue_full"] or ["retriable"]
        shape = data.draw(st.sampled_from(then), label="then")
        self.faults.arm("producer", "queue_full")
        self.faults.arm_after_full(shape)

    @precondition(lambda self: self.running)
    @rule()
    def faults_stop_and_time_passes(self) -> None:
        """Nothing more fails, and a minute passes with the threads running: every
        record due by then was forwarded or dead-lettered. In precise mode a record the
        forwarder took and dropped stays in its slot file (nothing is lost until a
        restart reads it again), so what shows such a path is a record held while the
        worker runs, not a commit past it."""
        self.faults.disarm()
        for _ in range(SETTLE_ROUNDS):
            self.time_passes(3.0)
            if not self.running:
                return  # a failure reported: the invariants start a new process
        now_ms = self.clock.ms()
        seen = {(tp, offset) for tp, offset, _, _ in self._seen()}
        held = sorted(
            spot
            for spot in self.broker.due_ms
            if self._latest_ms(spot) <= now_ms and spot not in seen and spot not in self.cancelled
        )
        self._check(
            not held,
            f"HELD: records {held} were due and not forwarded after a minute without faults "
            f"(faults fired before: {self.faults.log})",
        )
        self.every_cancel_answered()

    @precondition(lambda self: self.processes <= RESTARTS)
    @rule()
    def killed_and_restarted(self) -> None:
        self.processes += 1
        self._start()

    # -- invariants --------------------------------------------------------------------
    @invariant()
    def promises_hold(self) -> None:
        self.nothing_committed_past_a_record_not_held()
        self.nothing_forwarded_early()
        self.a_cancel_in_time_is_honoured()
        self.exactly_once_forwards_each_record_once()
        self.no_call_refused_for_its_state()
        self.every_thread_alive_or_reported()

    def _seen(self) -> list[tuple[tuple[str, int], int, str, float]]:
        """(partition, offset, topic, when sent) of each forward or dead letter a reader
        sees (read_committed in exactly-once), through every producer of every process."""
        out = []
        for producer in self.broker.producers:
            for sent in producer.visible():
                source = _source_of(sent)
                if source is not None and sent.topic in (TARGET, DLQ):
                    out.append((source[0], source[1], sent.topic, sent.at))
        return out

    def _on_disk(self, partition: int) -> set[int]:
        """Offsets of `partition` held unsettled in the data directory's files (a
        reschedule's copy holds the record its id names)."""
        store = self.worker.store  # type: ignore[union-attr]
        held: set[int] = set()
        for key, size in store.files(partition):
            records, _ = decode(store.read_at(key, 0, size))
            held.update(int(r.message_id.rsplit("-", 1)[1]) for r in records)
        return held

    def _commits(self) -> dict[tuple[str, int], int]:
        """Per partition, the offset below which no process will read a record again."""
        return self.broker.committed

    def nothing_committed_past_a_record_not_held(self) -> None:
        seen = {(tp, offset) for tp, offset, _, _ in self._seen()}
        for tp, upto in sorted(self._commits().items()):
            missing = [
                o
                for o in range(upto)
                if (tp, o) not in seen
                and (tp, o) not in self.markers
                and (tp, o) not in self.moves
                and (tp, o) not in self.cancelled
            ]
            if not missing:
                continue
            on_disk = self._on_disk(tp[1])
            lost = [o for o in missing if o not in on_disk]
            self._check(
                not lost,
                f"LOSS: {tp[0]}[{tp[1]}] committed at {upto} but records {lost} were neither "
                f"forwarded nor dead-lettered, nor held in a slot file (faults fired: "
                f"{self.faults.log})",
            )

    def nothing_forwarded_early(self) -> None:
        for tp, offset, topic, at in self._seen():
            if topic != TARGET:
                continue
            due = self._earliest_ms((tp, offset))
            moves = self.moved.get((tp, offset), [])
            why = "".join(f" (rescheduled at {at} to {to})" for at, to, _ in moves)
            self._check(
                at * 1000 >= due - 0.001,
                f"EARLY: {tp}@{offset} sent at {at}, due {due}{why} (faults fired: "
                f"{self.faults.log})",
            )

    def every_cancel_answered(self) -> None:
        """After a quiet minute every cancel and reschedule has its answer on the
        outcomes topic (as a read_committed reader sees it in exactly-once). A cancel
        that came in time says `accepted`; a reschedule that came in time says `moved`,
        or `cancelled` when a cancel came before it."""
        answered: dict[bytes, str] = {}
        for producer in [*self.broker.producers, *self.answer_producers]:
            for sent in producer.visible():
                if sent.topic == self.settings.precise_outcomes_topic and sent.key is not None:
                    answered[sent.key] = json.loads(sent.value)["outcome"]
        for kind, markers in (("cancel", self.markers), ("reschedule", self.moves)):
            for (tp, offset), spot in sorted(markers.items()):
                outcome = answered.get(reply_key(tp[0], tp[1], offset))
                self._check(
                    outcome is not None,
                    f"UNANSWERED: the {kind} at {tp}@{offset} of {spot} has no answer after"
                    f" a minute without faults (faults fired before: {self.faults.log})",
                )
                wanted = self._answers_in_time(kind, spot, offset)
                self._check(
                    wanted is None or outcome in wanted,
                    f"the {kind} at {tp}@{offset} came in time for {spot} and was answered "
                    f"{outcome!r}, not one of {sorted(wanted or ())} (faults fired before: "
                    f"{self.faults.log})",
                )

    def _answers_in_time(
        self, kind: str, spot: tuple[tuple[str, int], int], offset: int
    ) -> frozenset[str] | None:
        """The answers the marker at `offset` of `spot` may get when it came in time
        (None: it came late, or `spot` has nothing a reschedule could move). A
        reschedule and a cancel after it read in one batch: the moves of a batch are
        made after its cancels are kept, so the move finds the message cancelled."""
        if kind == "cancel":
            at = self.cancelled[spot]
            in_time = self._due_for_cancel(spot) - at >= self._lead_ms
            return frozenset({"accepted"}) if in_time else None
        if not self._move_in_time(spot, offset) or spot in self.invalid:
            return None
        cancelled = self.order.get(("cancel", spot))
        if cancelled is None:
            return frozenset({"moved"})
        if offset < cancelled:
            return frozenset({"moved", "cancelled"})
        return frozenset({"cancelled"})

    def _due_for_cancel(self, spot: tuple[tuple[str, int], int]) -> int:
        """`spot`'s due time as its cancel finds it: moved by the reschedules that came
        before (to the soonest of its times when one came late)."""
        return min(self._possible_dues(spot, before=self.order[("cancel", spot)]))

    def a_cancel_in_time_is_honoured(self) -> None:
        """A cancel appended at least `cancel_lead` before its record's due time: the
        record is never forwarded, nor a copy a reschedule made of it, whatever failed
        (closer to the due time it may go either way)."""
        forwarded = {(tp, offset) for tp, offset, topic, _ in self._seen() if topic == TARGET}
        for spot, at in self.cancelled.items():
            ahead_ms = self._due_for_cancel(spot) - at
            if ahead_ms >= self._lead_ms:
                self._check(
                    spot not in forwarded,
                    f"LEAKED: {spot} was forwarded though its cancel came {ahead_ms} ms before"
                    f" its due time (faults fired: {self.faults.log})",
                )

    def exactly_once_forwards_each_record_once(self) -> None:
        if not self.exactly_once:
            return
        counts = Counter((tp, offset) for tp, offset, _, _ in self._seen())
        twice = sorted(spot for spot, n in counts.items() if n > 1)
        self._check(
            not twice,
            f"DUPLICATE in committed transactions: {twice} (faults fired: {self.faults.log})",
        )

    def no_call_refused_for_its_state(self) -> None:
        producers = [*self.broker.producers, *self.answer_producers]
        refused = refused_for_state(producers, self.faults.log)
        self._check(refused is None, str(refused))

    def every_thread_alive_or_reported(self) -> None:
        if not self.running:
            self._check(bool(self.fatal), "a thread ended without reporting why")
            self.fatal_reports.extend(self.fatal)
            self._start()  # the daemon stops; a new one starts


@pytest.fixture(autouse=True)
def _no_real_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loops' pauses after an error are real waits on an event; a step is one pass."""
    monkeypatch.setattr(consumer_thread_module, "ERROR_PAUSE_S", 0.0)
    monkeypatch.setattr(intake_module, "ERROR_PAUSE_S", 0.0)
    monkeypatch.setattr(forwarder_module, "RESEEK_POLL_S", 0.0)


Machine = TypeVar("Machine", bound=PreciseWorkerSimulation)


@contextlib.contextmanager
def _simulation(
    exactly_once: bool,
    machine: type[Machine] = PreciseWorkerSimulation,  # type: ignore[assignment]
) -> Iterator[Machine]:
    """One simulation (of `machine`) stepped by hand, for a written sequence of its rules."""

    class Run(machine):  # type: ignore[valid-type,misc]
        pass

    Run.exactly_once = exactly_once
    sim = Run()
    try:
        yield sim
    finally:
        sim.teardown()


@pytest.mark.timeout(300 + EXAMPLES)  # shrinking a failure takes up to five minutes
@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_the_precise_worker_keeps_its_promises_under_every_fault(exactly_once: bool) -> None:
    run_guarantee(PreciseWorkerSimulation, exactly_once, SEEDS, "Precise")


def test_a_transaction_turned_abortable_in_the_queue_full_wait_does_not_hold_the_record() -> None:
    """Exactly-once: the producer's queue is full, and while the forwarder waits for
    room the open transaction turns abortable, before anything was sent in it. Each
    produce() is then refused (`_STATE`) and the record goes back to the buffer. Found
    by the simulation (seed 4712, example 763 of 1,000): with nothing sent, no commit
    point came to abort the transaction, and the record stayed due and unsent until a
    restart; an open transaction now reaches a commit point even when empty."""

    with _simulation(exactly_once=True) as sim:
        sim.faults_stop_and_time_passes()  # started, caught up, learned
        sim.faults.arm("producer", "queue_full")
        sim.faults.arm_after_full("txn_requires_abort")
        sim.records_arrive(0, 1, 0, True)
        sim.threads_run(["intake", "forwarder"])
        assert sim.faults.log == [
            "producer.produce: queue_full",
            "producer.poll: txn_requires_abort",
        ]
        sim.faults_stop_and_time_passes()  # fails: HELD


def test_a_transaction_the_coordinator_aborted_during_a_stall_does_not_hold_the_record() -> None:
    """Exactly-once: the poll after a send stalls 12 s, past `transaction.timeout.ms`,
    and the coordinator aborts the open transaction. Found by the simulation (seed
    4712, example 240 of 1,000): the commit point's delivery record was refused with
    `_STATE`, the error left the commit point before any abort, and every later commit
    point met the same refusal: the record stayed due and unsent until a restart."""

    with _simulation(exactly_once=True) as sim:
        sim.faults_stop_and_time_passes()  # started, caught up, learned
        sim.faults.arm("producer", "stall", stall_s=12.0)
        sim.records_arrive(0, 1, 0, True)
        sim.time_passes(0.01)
        assert sim.faults.log == ["producer.poll: stall"]
        sim.faults_stop_and_time_passes()  # failed: HELD


@pytest.mark.parametrize("together", [True, False], ids=["one batch", "two batches"])
@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_a_reschedule_after_a_cancel_is_answered_cancelled_and_moves_nothing(
    exactly_once: bool, together: bool
) -> None:
    """The cancel wins, in either order: a reschedule read after its message's cancel
    (in the cancel's batch or a later one) makes no copy and is answered `cancelled`,
    and the message is never sent (the invariants check both)."""

    with _simulation(exactly_once) as sim:
        sim.faults_stop_and_time_passes()  # started, caught up, learned
        sim.records_arrive(0, 1, 4_000, True)
        spot = ((TOPIC, 0), 0)
        sim.a_cancel_arrives(_Drawn(spot))  # type: ignore[arg-type]
        if not together:
            sim.threads_run(["intake"])
        sim.a_reschedule_arrives(_Drawn(spot), shift_ms=8_000, pending=True)  # type: ignore[arg-type]
        sim.threads_run(["intake", "loader", "forwarder"])
        sim.promises_hold()
        sim.faults_stop_and_time_passes()
        sim.promises_hold()
        assert sim.moved[spot][-1][1] < sim.clock.ms(), "the new time did not pass"


@pytest.mark.parametrize("together", [True, False], ids=["one batch", "two batches"])
@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_a_record_moved_again_goes_at_its_last_time_and_every_move_is_answered(
    exactly_once: bool, together: bool
) -> None:
    """The second reschedule moves the copy the first one made: the record goes once,
    at the second time (sooner than the first asked, later than its own), and both
    markers are answered `moved` (the invariants check all three)."""

    with _simulation(exactly_once) as sim:
        sim.faults_stop_and_time_passes()  # started, caught up, learned
        sim.records_arrive(0, 1, 4_000, True)
        spot = ((TOPIC, 0), 0)
        sim.a_reschedule_arrives(_Drawn(spot), shift_ms=12_000, pending=True)  # type: ignore[arg-type]
        if not together:
            sim.threads_run(["intake", "loader", "forwarder"])
        sim.a_reschedule_arrives(_Drawn(spot), shift_ms=-4_000, pending=True)  # type: ignore[arg-type]
        (_, first, _), (_, second, _) = sim.moved[spot]
        assert sim.broker.due_ms[spot] < second < first
        sim.threads_run(["intake", "loader", "forwarder"])
        sim.promises_hold()
        sim.faults_stop_and_time_passes()
        sim.promises_hold()
        sent = [at for tp, offset, topic, at in sim._seen() if (tp, offset) == spot]
        assert len(sent) == 1, sent
        assert second <= sent[0] * 1000 < first, (sent, second, first)


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_a_reschedule_appended_exactly_cancel_lead_before_the_due_time_is_honoured(
    exactly_once: bool,
) -> None:
    """At least `cancel_lead` before the due time includes exactly: found by the
    simulation (seed 4712, example 200 of 300). A read-through round began at the
    instant the reschedule was appended, just before it, and its end moved the gate
    to that instant; the record was handed out at its due time, which the limit
    reached exactly, and the move was answered `too_late`."""

    with _simulation(exactly_once) as sim:
        sim.records_arrive(0, 2, 1_500, True)
        sim.time_passes(0.5)
        sim.faults.arm("consumer", "timeout")
        sim.records_arrive(0, 1, 0, True)
        spot = ((TOPIC, 0), 0)
        sim.a_reschedule_arrives(_Drawn(spot), shift_ms=-4_000, pending=True)  # type: ignore[arg-type]
        at, _, _ = sim.moved[spot][0]
        assert sim.broker.due_ms[spot] - at == sim._lead_ms
        sim.time_passes(1.0)
        sim.promises_hold()
        sim.faults_stop_and_time_passes()  # fails: answered too_late
        sim.promises_hold()


def test_a_dead_letter_the_last_process_committed_is_not_sent_again_after_a_kill() -> None:
    """Exactly-once: a record without a valid envelope is dead-lettered in a transaction
    that commits, and the process is killed before the intake commits the record's
    offset. Found by the simulation (seed 4712, example 200 of 300): the next process
    read the record again and dead-lettered it again, a second copy in a committed
    transaction; the delivery records named only slot records."""
    with _simulation(exactly_once=True) as sim:
        sim.faults_stop_and_time_passes()  # started, caught up, learned
        sim.records_arrive(0, 1, 0, False)
        sim.threads_run(["intake", "forwarder"])
        sim.promises_hold()
        sim.killed_and_restarted()
        sim.promises_hold()
        sim.faults_stop_and_time_passes()
        sim.promises_hold()  # failed: DUPLICATE


@pytest.mark.parametrize("shape", ["lost_error", "bare_kafka_error"])
@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_a_consume_that_fails_after_fetching_reads_its_records_again(
    shape: str, exactly_once: bool
) -> None:
    """confluent-kafka destroys the batch a consume() fetched when a callback failed
    inside it, and the client has moved past it. The intake sought back only a batch it
    had in hand, and a `KafkaException` it took for passing not even that: records 0-2
    were never read (HELD, and their partition's commits held back until a restart)."""
    with _simulation(exactly_once=exactly_once) as sim:
        sim.faults_stop_and_time_passes()  # started, caught up
        sim.records_arrive(0, 3, 500, True)
        sim.faults.arm("consumer", shape, "consume")
        sim.time_passes(0.05)
        assert sim.faults.log == [f"consumer.consume: {shape}"]
        sim.records_arrive(0, 2, 800, True)
        sim.time_passes(1.0)
        sim.time_passes(1.0)
        sim.faults_stop_and_time_passes()  # fails: HELD
        forwarded = {(tp, offset) for tp, offset, _, _ in sim._seen()}
        assert {((TOPIC, 0), o) for o in range(5)} <= forwarded
