"""What the workers' simulations (`tests/level/test_worker_simulation.py`,
`tests/precise/test_worker_simulation.py`) share: the fake broker's state that
outlives a process, the error shapes a client call can fail with, the injector that
arms them on the fake clients, and the seeded run (`Simulation`, `run_seeded`) that
reports the seed, the first failing example and the shortest steps.

A fault is armed on a client (the consumer or the producer), not on one method: the
next call of that client that can fail that way fails that way, once. What can fail
how follows librdkafka and confluent-kafka 2.16:

- a `KafkaException` flagged retriable, fatal or txn_requires_abort, or with no flag;
  fatal and txn_requires_abort change the producer's state the way librdkafka does
  (`FakeProducer.go_fatal`, `FakeProducer.abortable`) instead of raising once: a
  fatal producer refuses everything after, an abortable transaction refuses
  produce() with `_STATE` until it is aborted;
- a bare `KafkaError` (not an exception class: `fakes.raise_bare_kafka_error`) and a
  `SystemError` that lost its exception, only from the calls that serve callbacks or
  wait on the broker (poll, flush, consume, commits, the transaction API), where
  confluent-kafka was seen to raise them; from `consume()` after it fetched (the batch
  is lost: `_after_its_work`);
- a full local queue (`BufferError`), only from produce(), and it stays full until the
  next poll() or flush() serves the producer;
- a timeout, each call its own way: flush() returns with reports left, poll() and
  consume() return nothing, commit_transaction() and abort_transaction() time out while
  the operation goes on (`commit_timeouts`, `abort_timeouts`), committed() times out as
  it does while a transaction holds the offsets; others raise `_TIMED_OUT`;
- a stall: a call that waits on the broker returns seconds past its own timeout (a
  coordinator or leader that answers late, librdkafka #5456). Its work is done when it
  starts, so its answer is as old as the stall when it returns, while the world goes on
  (`Faults.during_stall`: the application appends markers meanwhile). A stall longer
  than `transaction.timeout.ms` with a transaction open lets the coordinator abort that
  transaction, and the producer finds it abortable (librdkafka bumps the epoch).
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from confluent_kafka import KafkaError, KafkaException
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from delayservice.kafka.client_config import TRANSACTION_TIMEOUT_MS
from tests.level.fakes import TP, FakeClock, FakeConsumer, FakeProducer, raise_bare_kafka_error

SHAPES: Final = (
    "retriable",
    "fatal",
    "txn_requires_abort",
    "plain",
    "bare_kafka_error",
    "lost_error",
    "queue_full",
    "timeout",
    "stall",
)

STALLS_S: Final = (2.0, 12.0, 40.0)
"""How long a stalled call takes: past a pass's timeouts, past `transaction.timeout.ms`
(10 s), past every record's due time in an example."""

PRODUCER_CALLS: Final = (
    "produce",
    "poll",
    "flush",
    "init_transactions",
    "begin_transaction",
    "send_offsets_to_transaction",
    "commit_transaction",
    "abort_transaction",
)
CONSUMER_CALLS: Final = (
    "consume",
    "commit",
    "committed",
    "seek",
    "pause",
    "resume",
    "incremental_assign",
    "consumer_group_metadata",
    "position",
)
READER_CALLS: Final = (
    "consume",
    "position",
    "list_topics",
    "get_watermark_offsets",
    "offsets_for_times",
    "assign",
    "incremental_assign",
)
"""The calls the level marker reader makes of its two consumers (no group)."""
SERVING: Final = frozenset(
    {
        "poll",
        "flush",
        "init_transactions",
        "send_offsets_to_transaction",
        "commit_transaction",
        "abort_transaction",
        "consume",
        "commit",
        "committed",
    }
)
"""The calls that serve callbacks or wait on the broker: where confluent-kafka was seen
to leave a bare `KafkaError` or lose its exception."""
ASKING: Final = frozenset({"get_watermark_offsets", "list_topics", "offsets_for_times"})
"""The calls that ask the broker a question and wait for its answer (they can stall)."""


LOST_AFTER: Final = "lost_error_after_its_work"
"""Not drawn: a call that did its work and then lost its error (a callback that failed
while `commit_transaction` served it, after the commit). The caller cannot know the
client's state; the client refuses what that state does not allow (`_STATE`)."""


def can_fail(call: str, shape: str) -> bool:
    """Whether `call` can fail with `shape` (see the module's docstring)."""
    if shape in ("bare_kafka_error", "lost_error", LOST_AFTER):
        return call in SERVING
    if shape == "queue_full":
        return call == "produce"
    if shape == "stall":
        return call in SERVING or call in ASKING
    return True


@dataclass
class Broker:
    """What outlives a process: each partition's log and the group's committed offsets
    (consumer commits, and the offsets of committed transactions), shared by every
    fake consumer a process makes; and every producer ever made, whose acknowledged
    forwards and committed transactions are what readers of the targets see."""

    logs: dict[TP, list[Any]] = field(default_factory=dict)
    committed: dict[TP, int] = field(default_factory=dict)
    producers: list[FakeProducer] = field(default_factory=list)
    due_ms: dict[tuple[TP, int], int] = field(default_factory=dict)
    """Each record's due time, as the test wrote it."""

    def attach(self, consumer: FakeConsumer) -> None:
        consumer.logs = self.logs
        consumer.committed_tps = self.committed
        consumer.blocking = False


def outlived_its_timeout(producer: FakeProducer, seconds: float) -> None:
    """`producer` stood still `seconds` (a stalled call, a frozen process): past
    `transaction.timeout.ms` the coordinator aborts a transaction that holds something
    (its timer runs from then), and the producer finds it abortable."""
    timed_out = seconds * 1000 > TRANSACTION_TIMEOUT_MS
    if timed_out and producer.txn_open and producer.has_txn_content():
        producer.abortable = producer.abortable or KafkaError(
            KafkaError.INVALID_PRODUCER_EPOCH,
            "sim: the coordinator aborted the transaction (transaction.timeout.ms)",
        )


def refused_for_state(producers: list[FakeProducer], fired: list[str]) -> str | None:
    """What fails the invariant "no call refused for its state": a producer call
    librdkafka refuses for the transaction's state (`_STATE`: a produce() or a commit
    with no transaction open, a second begin) shows a step that took the state for
    another, and the error handling it then went through hides it from every other
    invariant. Only a call that did its work and lost its error (`LOST_AFTER`, in
    `fired`) leaves the caller unsure."""
    refused = sum(producer.state_refusals for producer in producers)
    if not refused or any(LOST_AFTER in line for line in fired):
        return None
    return f"{refused} producer calls refused for the transaction's state (faults fired: {fired})"


def _after_its_work(call: str, shape: str) -> bool:
    """Whether `call` fails with `shape` after doing its work. A broken shape comes from a
    callback that failed inside the call (confluent-kafka's `CallState_end`), and
    `Consumer_consume` then destroys the batch it fetched: the client has moved past
    those records, and nobody has them."""
    broken = shape in ("bare_kafka_error", "lost_error")
    return shape == LOST_AFTER or (call == "consume" and broken)


ASKS_UNSERVED: Final = 200
"""How many times in a row a consumer may ask for committed offsets with no consume()
between: its queue, where librdkafka says the client went fatal, stays unserved
meanwhile (a fenced client's `committed()` times out for as long as it is asked)."""


class QueueNeverServed(BaseException):
    """Not an `Exception`: no loop of a worker takes it for a client's error, so the
    example fails where it would have waited for ever."""


def _lost(target: Any, name: str) -> SystemError:
    kind = "Producer" if isinstance(target, FakeProducer) else "Consumer"
    return SystemError(
        f"<method '{name}' of 'cimpl.{kind}' objects> returned NULL without setting an exception"
    )


class Faults:
    """Faults armed on the fake clients of one process; `log` keeps what fired."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        """What a stall moves on."""
        self.during_stall: Callable[[str], None] | None = None
        """What the world does halfway through a stall of a client (the simulation's)."""
        self.armed: dict[str, deque[tuple[str, str | None, float]]] = {
            "consumer": deque(),
            "producer": deque(),
            "reader": deque(),
        }
        """Per client, (shape, the call it waits for, or None for the next that can fail,
        how long a stall takes)."""
        self.log: list[str] = []
        self._full: set[int] = set()
        self._depth = 0
        self.after_full: deque[str] = deque()
        """Armed on the producer the moment a full queue fires (`arm_after_full`)."""
        self._asks: dict[int, int] = {}
        """Per consumer, its `committed()` calls since its last consume()."""

    def arm(
        self, client: str, shape: str, call: str | None = None, stall_s: float = STALLS_S[0]
    ) -> None:
        self.armed[client].append((shape, call, stall_s))

    def arm_after_full(self, shape: str) -> None:
        """Arm `shape` on the producer the moment its queue is next full: the next call
        that can fail that way, in the wait for room, fails. Armed at once, a shape a
        transaction call can take would fail the commit point before the send instead."""
        self.after_full.append(shape)

    def disarm(self) -> None:
        """The process is gone: what was armed on its clients never fires."""
        for armed in self.armed.values():
            armed.clear()
        self.after_full.clear()

    def wrap_producer(self, producer: FakeProducer) -> FakeProducer:
        for name in PRODUCER_CALLS:
            setattr(producer, name, self._wrapped("producer", producer, name))
        return producer

    def wrap_consumer(self, consumer: FakeConsumer) -> FakeConsumer:
        for name in CONSUMER_CALLS:
            setattr(consumer, name, self._wrapped("consumer", consumer, name))
        return consumer

    def wrap_reader(self, consumer: FakeConsumer) -> FakeConsumer:
        """A consumer of the level marker reader (its reading one or its lister)."""
        for name in READER_CALLS:
            setattr(consumer, name, self._wrapped("reader", consumer, name))
        return consumer

    def _wrapped(self, client: str, target: Any, name: str) -> Callable[..., Any]:
        original = getattr(target, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self._count_asks(target, name)  # inside consume() too (a rebalance callback)
            if self._depth:  # the fake calling itself (commit_transaction flushes)
                return original(*args, **kwargs)
            if name in ("poll", "flush"):
                self._full.discard(id(target))  # serving the producer makes room
            elif name == "produce" and id(target) in self._full:
                raise BufferError("Local: Queue full")
            armed = self.armed[client]
            chosen = next((a for a in armed if a[1] in (None, name) and can_fail(name, a[0])), None)
            if chosen is not None:
                armed.remove(chosen)
                shape = chosen[0]
                self.log.append(f"{client}.{name}: {shape}")
                if shape == "stall":
                    run = lambda: original(*args, **kwargs)  # noqa: E731
                    return self._stalled(client, target, run, chosen[2])
                if _after_its_work(name, shape):
                    self._depth += 1
                    try:
                        original(*args, **kwargs)
                    finally:
                        self._depth -= 1
                    shape = "lost_error" if shape == LOST_AFTER else shape
                done, value = self._fail(target, name, shape)
                if done:
                    return value
            self._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._depth -= 1

        return call

    def _count_asks(self, target: Any, name: str) -> None:
        if name == "consume":
            self._asks.pop(id(target), None)
        elif name == "committed":
            asks = self._asks[id(target)] = self._asks.get(id(target), 0) + 1
            if asks > ASKS_UNSERVED:
                raise QueueNeverServed(f"committed() asked {asks} times with no consume() between")

    def _stalled(self, client: str, target: Any, call: Callable[[], Any], seconds: float) -> Any:
        """Run `call` at once, and return its answer (or raise its error) `seconds`
        later, with the world acting halfway."""
        self._depth += 1
        try:
            return call()
        finally:
            self._depth -= 1
            self.clock.advance(seconds / 2)
            if self.during_stall is not None:
                self.during_stall(client)
            self.clock.advance(seconds / 2)
            if isinstance(target, FakeProducer):
                outlived_its_timeout(target, seconds)

    def _fail(self, target: Any, name: str, shape: str) -> tuple[bool, Any]:
        """Fail the call `name` of `target` with `shape`: raise, or return (True, what
        the call returns instead), or change the fake's state and let the call run
        (False, None) so that the fake refuses it as librdkafka would."""
        code = KafkaError._TRANSPORT if name != "produce" else KafkaError._MSG_TIMED_OUT
        if shape == "retriable":
            raise KafkaException(KafkaError(code, f"sim: {name} failed", retriable=True))
        if shape == "plain":
            raise KafkaException(KafkaError(KafkaError._STATE, f"sim: {name} refused"))
        if shape == "fatal":
            # librdkafka's thread sets it; the clients say it as the real ones do (a
            # consumer's committed() never does: it times out)
            if isinstance(target, (FakeProducer, FakeConsumer)):
                target.go_fatal()
                return False, None
            raise KafkaException(
                KafkaError(KafkaError.FENCED_INSTANCE_ID, f"sim: {name} fatal", fatal=True)
            )
        if shape == "txn_requires_abort":
            if isinstance(target, FakeProducer) and target.transactional and target.txn_open:
                target.abortable = KafkaError(KafkaError._MSG_TIMED_OUT, "sim: abortable")
                return False, None
            raise KafkaException(
                KafkaError(KafkaError._STATE, f"sim: {name} abortable", txn_requires_abort=True)
            )
        if shape == "bare_kafka_error":
            raise_bare_kafka_error(KafkaError(code, f"sim: bare error from {name}"))
            return True, None  # not reached: the error is raised on return
        if shape == "lost_error":
            raise _lost(target, name)
        if shape == "queue_full":
            self._full.add(id(target))
            self.armed["producer"].extendleft(
                (then, None, STALLS_S[0]) for then in reversed(self.after_full)
            )
            self.after_full.clear()
            raise BufferError("Local: Queue full")
        assert shape == "timeout", shape
        return self._time_out(target, name)

    @staticmethod
    def _time_out(target: Any, name: str) -> tuple[bool, Any]:
        if name == "flush":
            return True, target.pending  # nothing served: every report still queued
        if name in ("poll", "consume"):
            return True, 0 if name == "poll" else []
        if name == "commit_transaction" and target.txn_open:
            target.commit_timeouts += 1
            return False, None
        if name == "abort_transaction" and target.txn_open:
            target.abort_timeouts += 1
            return False, None
        if name == "committed":
            target.unstable_answers += 1
            return False, None
        raise KafkaException(
            KafkaError(KafkaError._TIMED_OUT, f"sim: {name} timed out", retriable=True)
        )


EXAMPLES: Final = int(os.environ.get("DELAYSERVICE_SIM_EXAMPLES", "60"))
"""Seeded examples per guarantee: CI's count unless DELAYSERVICE_SIM_EXAMPLES asks for
more (`./scripts/test.sh --all`)."""
STEPS: Final = int(os.environ.get("DELAYSERVICE_SIM_STEPS", "60"))


class Members:
    """A simulation of several members of one group, stepped from one thread: the
    attributes `PER_MEMBER` names belong to the member loaded (`member`), and `_as`
    loads another while it steps (its rules, fakes and invariants are the one-member
    simulation's, run as that member)."""

    PER_MEMBER: ClassVar[tuple[str, ...]] = ()
    member: int
    kept: dict[int, dict[str, Any]]
    """Member -> its attributes while another is loaded."""

    def _store(self) -> None:
        self.kept[self.member] = {name: getattr(self, name) for name in self.PER_MEMBER}

    @contextlib.contextmanager
    def _as(self, member: int) -> Iterator[None]:
        """Load `member`'s process into the simulation's attributes while it steps."""
        before = self.member
        if member != before:
            self._store()
            for name, value in self.kept[member].items():
                setattr(self, name, value)
            self.member = member
        try:
            yield
        finally:
            if member != before:
                self._store()
                for name, value in self.kept[before].items():
                    setattr(self, name, value)
                self.member = before


class Simulation(RuleBasedStateMachine):
    """A worker's simulation: counts its examples and notes the first that failed."""

    exactly_once: ClassVar[bool] = False

    examples: ClassVar[int] = 0
    """Examples begun so far in this run (shrinking's included)."""
    first_failure: ClassVar[int | None] = None
    """The example in which an invariant first failed."""

    def __init__(self) -> None:
        super().__init__()
        type(self).examples += 1

    def _check(self, holds: bool, why: str) -> None:
        if not holds:
            if type(self).first_failure is None:
                type(self).first_failure = type(self).examples
            raise AssertionError(why)


def run_seeded(
    machine: type[Simulation], default_seed: int, what: str, *, examples: int = EXAMPLES
) -> None:
    """Run `machine` from `default_seed` (or DELAYSERVICE_SIM_SEED); a failure says the
    seed, the example it first failed in and how to run it again, beside hypothesis'
    shortest sequence of steps and its `@reproduce_failure` blob."""
    chosen = int(os.environ.get("DELAYSERVICE_SIM_SEED", default_seed))
    try:
        run_state_machine_as_test(
            seed(chosen)(machine),
            settings=settings(
                max_examples=examples,
                stateful_step_count=STEPS,
                deadline=None,
                database=None,
                print_blob=True,
                suppress_health_check=list(HealthCheck),
                phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
            ),
        )
    except BaseException as exc:
        exc.add_note(
            f"first failed in example {machine.first_failure} of the run; "
            f"simulation seed {chosen} ({what}, {examples} examples of up to {STEPS} "
            f"steps): rerun with DELAYSERVICE_SIM_SEED={chosen} "
            f"DELAYSERVICE_SIM_EXAMPLES={examples}"
        )
        raise


def run_guarantee(
    machine: type[Simulation],
    exactly_once: bool,
    seeds: dict[bool, int],
    worker: str,
    *,
    examples: int = EXAMPLES,
) -> None:
    """`run_seeded` for one guarantee of `machine` (a fresh subclass: its counts are
    its own), from that guarantee's seed in `seeds`."""
    guarantee = "exactly-once" if exactly_once else "at-least-once"
    run = type(f"{worker}{guarantee.title().replace('-', '')}Simulation", (machine,), {})
    run.exactly_once = exactly_once
    run_seeded(
        run, seeds[exactly_once], f"{worker.lower() or 'level'}, {guarantee}", examples=examples
    )
