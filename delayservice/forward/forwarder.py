"""The forwarder thread of a level: sends due records, and commits like Kafka Streams.

It sleeps on the buffer's condition until the earliest partition head is due or the
next commit point, and is woken early when an earlier head arrives. Each due record is
sent as it is (key, value, the user's headers plus `delay-id` and `delay-due-ms`),
with no delivery callback of its own: the level's producer reports only failures.

At each commit point (every `commit_interval`, sooner once nothing is due, but never
more often than `floor`) the forwarder makes what it sent durable, then moves each
partition's committable offset to the one after the last record sent:

- at-least-once: flush the producer; the offsets go to the consumer thread, which
  commits them (the consumer is that thread's alone);
- exactly-once: the records went inside a transaction; the offsets join it with
  `send_offsets_to_transaction` (the consumer thread hands over its group metadata)
  and the transaction commits. One thread owns the producer, so nothing is produced
  while a commit is in flight.

A refusal makes the interval's partitions go again from the failed record
(`failures.Failures` decides doom or retry); in exactly-once the transaction is
aborted first and everything it held goes again, so a read_committed reader sees each
record once. A record whose envelope asks for more than its level is re-published
once, with its absolute due time, to where it fits (the precise topic when precise mode
runs, else the smallest level that holds what remains) and its partition moves on.

Precise mode forwards through this forwarder too, at-least-once, over its own buffer
(`forward.buffer.Buffer`): each commit point hands the records it made durable to
`settle`, which settles them in their slots (`precise_worker.settle_durable`).

No exception from one record escapes a send; the loop survives anything else.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, Message

from delayservice.forward import dead_letter as dl
from delayservice.forward.buffer import Buffer, Runs
from delayservice.forward.failures import UNKNOWN_TARGET, Failures, Key
from delayservice.forward.held_record import offset_of
from delayservice.forward.sender import (
    FENCED,
    ForwarderFatalError,
    RecordSender,
    Routes,
    SendLaterError,
    producer_failed,
)
from delayservice.forward.transaction import Transaction
from delayservice.kafka.client_errors import error_of, is_fatal
from delayservice.kafka.target_topics import TargetTopics
from delayservice.kafka.unconfirmed_acks import UnconfirmedAcks
from delayservice.levels import Level
from delayservice.log_throttle import Throttle
from delayservice.metrics.service_metrics import COMMIT_STEPS, ServiceMetrics

__all__ = ["Forwarder", "ForwarderFatalError", "Routes", "commit_floor"]

log = logging.getLogger(__name__)

UNCONFIRMED: Final = "unconfirmed_ack"
TAKE: Final = 5_000
"""Records taken per pass: a burst goes out while the rest still waits in the buffer."""
HANDOVER_WAIT_S: Final = 20.0
"""How often a consumer thread still waiting for a hand-over says so. It never gives up
while the forwarder lives: returning with the outcome open would let the forwarder
commit records of a partition after its new owner has read the offsets."""
GROUP_ERRORS: Final = frozenset(
    {
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError.REBALANCE_IN_PROGRESS,
    }
)
"""The group moved on under the transaction: what it held may no longer be this
member's to send, so nothing of it is sent again from memory (see `_reset`)."""
RESEEK_POLL_S: Final = 0.05
REBUILDS: Final = 5
REBUILD_WINDOW_S: Final = 300.0


def commit_floor(interval_s: float) -> float:
    """How soon after the last commit a forwarder that has sent everything due may
    commit again: a fifth of the interval, within 10 to 200 ms. Committing once caught
    up shortens what read_committed readers wait (exactly-once: at a steady rate they
    would otherwise wait for the whole interval, since some record is always about to
    fall due) and what is re-read after a crash. Nothing is due when it starts, but
    what falls due during the commit waits for it (exactly-once at 10,000 msg/s over
    three levels: most of the forwarder's time; docs/performance.md); the floor keeps
    a trickle of records from turning into a commit per record (each commit is a flush
    and one or two round trips). A backlog commits at the interval."""
    return min(0.2, max(0.01, interval_s / 5))


@dataclass
class _Request:
    partitions: set[int]
    commit: bool
    done: threading.Event = field(default_factory=threading.Event)
    offsets: dict[int, int] = field(default_factory=dict)
    ok: bool = False


class Forwarder:
    def __init__(
        self,
        level: Level,
        group: Buffer,
        producer: Any,
        targets: TargetTopics,
        routes: Routes,
        metrics: ServiceMetrics,
        on_fatal: Callable[[str], None],
        *,
        transactional: bool,
        unconfirmed: UnconfirmedAcks,
        commit_interval_s: float,
        flush_timeout_s: float,
        backoff: tuple[float, float] = (1.0, 30.0),
        give_up_s: float = 300.0,
        clock: Any = time,
        make_producer: Callable[[], Any] | None = None,
        settle: Callable[[Runs], None] | None = None,
    ) -> None:
        """`producer` is this level's own, built with `on_delivery=self.on_report` and
        `delivery.report.only.error` (and a `transactional.id` when `transactional`),
        its log lines going through `unconfirmed` (`watch_unconfirmed`). `settle` is
        handed, at each commit point, the records it made durable (precise mode settles
        them in its slots; see `PreciseWorker`)."""
        self.level = level
        self.group = group
        self._producer = producer
        self._make_producer = make_producer
        self._rebuilds: deque[float] = deque()
        self._routes = routes
        self._on_fatal = on_fatal
        self.transactional = transactional
        self._unconfirmed = unconfirmed
        self._interval = commit_interval_s
        self._floor = commit_floor(commit_interval_s)
        self._flush_timeout = flush_timeout_s
        self._clock = clock
        self._settle = settle
        name = level.name
        self._m_forwarded = metrics.forwarded.labels(name)
        self._m_lateness = metrics.lateness
        metrics.lateness.labels(name)
        self._m_dead = metrics.dead_lettered
        for reason in dl.REASONS:
            self._m_dead.labels(name, reason)
        self._m_stubs = metrics.dead_letter_stubs.labels(name)
        self._m_errors = metrics.forward_errors
        self._m_loop_errors = metrics.loop_errors.labels(name, "forwarder")
        self._m_commits = metrics.commits.labels(name)
        self._m_commit_failures = metrics.commit_failures.labels(name)
        self._m_steps = {
            step: metrics.commit_step_seconds.labels(name, step) for step in COMMIT_STEPS
        }
        self.failures = Failures(
            routes.dead_letter_topic,
            backoff,
            give_up_s,
            lambda error: self._m_errors.labels(name, error).inc(),
            clock.monotonic,
        )
        self._stopping = threading.Event()
        self.sender = RecordSender(
            level, group, producer, targets, routes, metrics, self.failures, self._stopping, clock
        )
        self.on_report = self.sender.on_report
        """The producer's delivery callback (`on_delivery`): failures only."""
        # The open interval: what was sent since the last commit point.
        self._runs: Runs = []
        self._sent_through: dict[int, int] = {}
        self._waiting: dict[int, dict[int, tuple[int, Message]]] = {}
        """At-least-once: partition -> offset -> (not before, epoch ms; record), for
        records that failed and go again on their own."""
        self.set_aside_due_ms: int | None = None
        """The earliest due time among `_waiting`'s records, for the consumer thread's
        gauges: a record waiting out a backoff is held, and overdue."""
        self._committed: dict[int, int] = {}
        self._taken_from: dict[int, int | None] = {}
        """partition -> the assignment (`Buffer.incarnation`) its open records came from."""
        self._reseek = threading.Event()
        """Set while the consumer thread is to drop this level's queues and seek back to
        the committed offsets (`reseek_wanted`); nothing is taken meanwhile."""
        self._txn = Transaction(level.topic, producer, self._stopping, clock, self._step_spent)
        # progress_at: when a commit point last made records durable (`stalled`).
        self._last_commit = self.progress_at = clock.monotonic()
        self._throttle = Throttle()
        # Shared with the consumer thread.
        self._lock = threading.Lock()
        self._durable: dict[int, int] = {}
        self._requests: list[_Request] = []
        self._thread = threading.Thread(
            target=self._main, name=f"forwarder-{level.topic}", daemon=True
        )

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def request_stop(self) -> None:
        self._stopping.set()
        self.group.wake()

    def stop(self, timeout: float) -> None:
        """Stop after a last commit point; what could not be committed is re-read."""
        self.request_stop()
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    # -- the consumer thread's side --------------------------------------------------
    @property
    def group_metadata(self) -> Any:
        """The consumer's group metadata, handed over by the consumer thread (exactly-once)."""
        return self._txn.group_metadata

    @group_metadata.setter
    def group_metadata(self, metadata: Any) -> None:
        self._txn.group_metadata = metadata

    def take_durable(self) -> dict[int, int]:
        """Offsets made durable since the last call (at-least-once), for the consumer
        thread to commit."""
        with self._lock:
            durable, self._durable = self._durable, {}
        return durable

    def handover(self, partitions: set[int], *, commit: bool) -> dict[int, int] | None:
        """Called by the consumer thread on revoke (`commit`) or loss: the forwarder
        reaches a commit point (or drops without one) and lets `partitions` go. Returns
        the offsets now durable for them (at-least-once: the caller commits them; in
        exactly-once they are committed already), None when that failed."""
        request = _Request(set(partitions), commit)
        if self._thread.is_alive():
            with self._lock:
                self._requests.append(request)
            self.group.wake()
            said = time.monotonic()
            while not request.done.wait(0.05):
                if not self._thread.is_alive():
                    with self._lock:
                        mine = request in self._requests
                        if mine:
                            self._requests.remove(request)
                    if mine:
                        self._serve(request)  # the thread ended before it saw the request
                    break
                if time.monotonic() - said > HANDOVER_WAIT_S:
                    said = time.monotonic()
                    log.warning(
                        "%s: still waiting for the forwarder to hand over %s",
                        self.level.topic,
                        sorted(partitions),
                    )
        else:
            self._serve(request)  # the forwarder thread is gone: its state is ours now
        return request.offsets if request.ok else None

    def stalled(self, budget_s: float) -> str | None:
        """Why this forwarder counts as stuck, for readiness; None while it is not: a
        record has been due for longer than `budget_s` (the retry budget) and no commit
        point made anything durable for as long (a producer that cannot reach the
        broker, or a commit that keeps failing). One record failing while others go out
        is not stuck: it is dead-lettered after the same budget. Read from another
        thread: plain attribute reads and the buffer's own lock."""
        clock = self._clock
        idle_s = clock.monotonic() - self.progress_at
        if idle_s <= budget_s:
            return None
        due_of = self.group.due_of
        sent = [due_of(p, records[0]) for p, records in list(self._runs) if records]
        held = [ms for ms in (self.group.earliest_held_ms(), self.set_aside_due_ms) if ms]
        held += sent  # sent and not yet durable: as good as held
        if not held:
            return None
        overdue_s = clock.time() - min(held) / 1000
        if overdue_s <= budget_s:
            return None
        return (
            f"nothing forwarded for {idle_s:.0f}s while records are due "
            f"(the oldest {overdue_s:.0f}s ago)"
        )

    def reseek_wanted(self) -> bool:
        """Whether the consumer thread is to drop the queues and seek every owned
        partition back to its committed offset, then call `reseek_done`."""
        return self._reseek.is_set()

    def reseek_done(self) -> None:
        self._reseek.clear()
        self.group.wake()

    # -- the loop ------------------------------------------------------------------
    def _main(self) -> None:
        if self.transactional:
            try:
                self._txn.init()
            except SendLaterError as exc:  # tried again before the first send
                log.info("%s: %s; trying again before the first send", self.level.topic, exc)
            except ForwarderFatalError as exc:
                if exc.fenced:  # another live instance holds this transactional id
                    self._on_fatal(str(exc))
                    return
                log.warning("%s: %s; the send loop takes it from here", self.level.topic, exc)
        try:
            self._run()
        except ForwarderFatalError as exc:
            self._on_fatal(str(exc))
            return
        try:
            self._commit_point()
        except ForwarderFatalError as exc:
            self._on_fatal(str(exc))
        except Exception:
            log.exception("%s: last commit failed; records will be re-read", self.level.topic)
        with self._lock:
            requests, self._requests = self._requests, []
        for request in requests:
            self._serve(request)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.step(wait=True)
            except ForwarderFatalError:
                raise
            except SendLaterError as exc:  # the transaction coordinator is not there yet
                if self._throttle.allow("later") is not None:
                    log.warning("%s: %s; trying again", self.level.topic, exc)
                self._stopping.wait(0.5)
            except Exception:
                self._m_loop_errors.inc()
                log.exception("forwarder of %s: unexpected error; continuing", self.level.topic)
                self._stopping.wait(0.5)

    def step(self, *, wait: bool = False, commit: bool = False) -> None:
        """One pass of the loop: sleep until something is due (`wait`), send what is due,
        and reach a commit point when one is due (or when `commit`, for tests). A
        producer that failed for good is replaced here (`rebuild_producer`)."""
        try:
            self._step(wait=wait, commit=commit)
        except ForwarderFatalError as exc:
            self.rebuild_producer(exc)

    def _step(self, *, wait: bool, commit: bool) -> None:
        clock = self._clock
        self._serve_requests()
        if wait:
            deadline = self._last_commit + self._floor if self._runs else float("inf")
            until = clock.time() + max(0.0, deadline - clock.monotonic())
            if self._waiting:
                earliest = min(u for held in self._waiting.values() for u, _ in held.values())
                until = min(until, earliest / 1000)
            self.group.wait(until)
            if self._stopping.is_set():
                return
            self._serve_requests()
        if self._reseek.is_set():  # the queues are stale until the consumer thread seeks
            self._stopping.wait(RESEEK_POLL_S)
            return
        if self._waiting:
            self._send_waiting()
        runs = self.group.take(TAKE)
        if runs:
            try:
                self._send_runs(runs)
            finally:
                self.group.settle()
            self.sender.poll(0)
        since = clock.monotonic() - self._last_commit
        if commit or (
            self._runs
            and (
                since >= self._interval
                or self.sender.reports
                or (since >= self._floor and self._idle())
            )
        ):
            self._commit_point()

    def _idle(self) -> bool:
        head = self.group.next_due_ms()
        return head is None or head > self._clock.time() * 1000

    def _serve_requests(self) -> None:
        if not self._requests:
            return
        with self._lock:
            requests, self._requests = self._requests, []
        for request in requests:
            self._serve(request)

    def _serve(self, request: _Request) -> None:
        """Commit (revoke) or drop (loss) what the open interval holds, then forget every
        trace of `request.partitions`, on every path: a record of theirs left anywhere
        here could be sent and committed after their new owner read the offsets. The
        open transaction is ended first (committed, aborted, or fenced by a new
        producer), so it never holds them past this call."""
        gone = request.partitions
        try:
            try:
                if request.commit:
                    request.ok = self._commit_point()
                else:
                    self._abandon(gone)
                    request.ok = True
                request.offsets = {p: o for p, o in self._committed.items() if p in gone}
            except ForwarderFatalError:
                raise
            except Exception:
                self._m_loop_errors.inc()
                log.exception("%s: handing over %s failed", self.level.topic, sorted(gone))
                request.ok = False
                self._end_transaction()
        except ForwarderFatalError as exc:
            request.ok = False
            self._drop_from_interval(gone)  # never sent again, whatever happens next
            try:
                self.rebuild_producer(exc)
            except ForwarderFatalError as final:
                self._on_fatal(str(final))
        finally:
            self._forget(gone)
            request.done.set()

    def _end_transaction(self) -> None:
        """Abort the open transaction (its records go again from the queues); raises
        `ForwarderFatalError` when even that fails (the producer is then fenced)."""
        if self.transactional and self._txn.open:
            self._txn.abort()
            self._requeue({})

    def _drop_from_interval(self, partitions: set[int]) -> None:
        self._runs = [(p, r) for p, r in self._runs if p not in partitions]

    def _forget(self, partitions: set[int]) -> None:
        self.group.drop(partitions)
        self.failures.forget(partitions)
        self._drop_from_interval(partitions)
        for table in (self._sent_through, self._committed, self._waiting, self._taken_from):
            for partition in partitions:
                table.pop(partition, None)
        self._waiting_changed()
        with self._lock:
            for partition in partitions:
                self._durable.pop(partition, None)

    def rebuild_producer(self, failure: ForwarderFatalError) -> None:
        """Replace a producer that failed for good: everything sent since the last
        commit goes back to the buffer and is sent again through a new one (whose
        init_transactions ends the old one's transaction). A fenced producer is
        replaced too: the coordinator fences a producer whose transaction outlived its
        timeout (a process frozen or starved that long) just as it fences one whose
        transactional id a newer process took. Raises `failure` when no new one can be
        made, or when it keeps happening (`REBUILDS` in `REBUILD_WINDOW_S`: for a fence,
        another live process with the same instance name)."""
        now = self._clock.monotonic()
        while self._rebuilds and now - self._rebuilds[0] > REBUILD_WINDOW_S:
            self._rebuilds.popleft()
        if self._make_producer is None or len(self._rebuilds) >= REBUILDS:
            raise failure
        self._rebuilds.append(now)
        log.error("%s: %s; replacing the producer", self.level.topic, failure)
        self.sender.reports.clear()
        self._unconfirmed.take()  # the interval goes again anyway
        if self.transactional:
            self._reset()  # its transaction's outcome is unknown: nothing from memory
        else:
            self._requeue({})
        old = self._producer
        try:
            old.purge()
        except Exception as exc:  # a failed client may refuse even this
            log.warning("%s: purging the failed producer: %s", self.level.topic, exc)
        self._producer = self._make_producer()
        self.sender.replace_producer(self._producer)
        self._txn.replace(self._producer)
        if self.transactional:
            try:  # fence now: the old transaction ends (committed or aborted) at once
                self._txn.init()
            except (SendLaterError, ForwarderFatalError) as exc:  # the next send tries again
                log.warning("%s: %s; fencing at the next send", self.level.topic, exc)

    def _reset(self) -> None:
        """After an unknown outcome or a group error, as Kafka Streams does: nothing held
        in memory is sent again. The interval and the queues are dropped and the
        consumer thread seeks every owned partition back to its committed offset, which
        says what the transaction did; until then nothing is taken."""
        self._reseek.set()
        self._runs = []
        self._taken_from.clear()
        self._waiting.clear()
        self._waiting_changed()
        self._sent_through = dict(self._committed)
        self.failures.dead_sent.clear()
        self.sender.rerouted.clear()
        self.sender.lateness = []

    def _abandon(self, partitions: set[int]) -> None:
        """Lost partitions: nothing of theirs may commit. In exactly-once the open
        transaction holds their records, so it is aborted and the others go again."""
        if self.transactional and self._txn.open:
            self._txn.abort()
            self._requeue({})
        else:
            self._runs = [(p, r) for p, r in self._runs if p not in partitions]

    # -- sending -------------------------------------------------------------------
    def _send_runs(self, runs: Runs) -> None:
        if self.transactional and not self._txn.open:
            try:
                self._txn.begin()
            except BaseException:
                for partition, records in runs:  # taken, never sent: back where they were
                    self.group.put_back(partition, records)
                raise
        taken_from = self._taken_from
        for index, (partition, taken) in enumerate(runs):
            if partition not in taken_from:
                taken_from[partition] = self.group.incarnation(partition)
            try:
                sent = self.sender.send_run(partition, taken)
            except BaseException:
                self._unsent(runs[index:])
                raise
            records = taken
            if sent < len(taken):
                # The rest of this partition waits (metadata unreachable, or a stop while
                # the producer's queue is full); a stop hands back every later run too.
                hold = 0 if self._stopping.is_set() else self._retry_hold_ms()
                self.group.put_back(partition, taken[sent:], hold, taken_from[partition])
                records = taken[:sent]
            if records:
                self._runs.append((partition, records))
                self._sent_through[partition] = offset_of(records[-1]) + 1
            if sent < len(taken) and self._stopping.is_set():
                for later, rest in runs[index + 1 :]:
                    self.group.put_back(later, rest)
                return

    def _unsent(self, runs: Runs) -> None:
        """A send raised past the sender (a producer gone fatal, or a bug): which records
        of the first run went out is unknown, so it goes back whole with every run after
        it, and nothing it held is lost. Under exactly-once the open transaction may
        hold some of them: it is aborted and the whole interval goes again, so a
        read_committed reader still sees each record once (at-least-once: those that
        went out may arrive twice). A failed abort raises, and the producer is fenced."""
        for partition, records in reversed(runs):
            self.group.put_back(partition, records, 0, self._taken_from.get(partition))
        if self.transactional and self._txn.open:
            self._end_transaction()

    def _retry_hold_ms(self) -> int:
        return int(self._clock.time() * 1000) + self.failures.backoff_ms(1)

    # -- commit points -------------------------------------------------------------
    def _commit_point(self) -> bool:
        """Make the interval durable and move the committable offsets; False when it
        could not (it is tried again, or sent again, from the same offsets)."""
        self._last_commit = self._clock.monotonic()
        if not self._runs and not self._txn.open:
            return True
        remaining = self.sender.flush(self._flush_timeout)
        self._step_spent("flush", self._clock.monotonic() - self._last_commit)
        if remaining:
            self._m_commit_failures.inc()
            log.warning(
                "%s: %d forwards unacknowledged after %.0fs; not committing yet",
                self.level.topic,
                remaining,
                self._flush_timeout,
            )
            if self.transactional:
                self._txn.abort()
                self._requeue({})
            return False
        self.sender.poll(0)  # log lines queued behind the last report
        if self._resent_unconfirmed():
            return False
        if self.sender.reports:
            again, backoff_ms = self._place_reports()
            if self.transactional:
                self._txn.abort()
                self._requeue(self._holds(again, backoff_ms))
                return False
            self._set_aside(again, backoff_ms)
        offsets = self._committable()
        if self.transactional:
            if not self._commit_transaction(offsets):
                return False
        else:
            with self._lock:
                self._durable.update(offsets)
        self._committed.update(offsets)
        self._settled()
        return True

    def _step_spent(self, step: str, seconds: float) -> None:
        self._m_steps[step].observe(seconds)

    def _resent_unconfirmed(self) -> bool:
        """When librdkafka inferred a success in this interval, nothing of it commits:
        everything goes again (exactly-once: after an abort, so readers see it once)."""
        inferred, line = self._unconfirmed.take()
        if not inferred:
            return False
        records = sum(len(r) for _, r in self._runs)
        self._m_errors.labels(self.level.name, UNCONFIRMED).inc(records)
        held_back = self._throttle.allow(UNCONFIRMED)
        if held_back is not None:
            log.warning(
                "%s: librdkafka inferred a delivery the broker did not confirm (%s); "
                "sending the %d records since the last commit again%s",
                self.level.topic,
                line,
                records,
                f" ({held_back} more times since the last line)" if held_back else "",
            )
        self.sender.reports.clear()
        if self.transactional:
            self._txn.abort()
        self._requeue({})
        return True

    def _committable(self) -> dict[int, int]:
        """Per partition, the offset after the last record sent, but never past a record
        still waiting to go again (at-least-once), where it moved since the last commit."""
        out: dict[int, int] = {}
        waiting = self._waiting
        for partition, sent_through in self._sent_through.items():
            held = waiting.get(partition)
            offset = min(sent_through, *held) if held else sent_through
            if self._committed.get(partition) != offset:
                out[partition] = offset
        return out

    def _settled(self) -> None:
        self.progress_at = self._clock.monotonic()
        runs, self._runs = self._runs, []
        self._taken_from = {p: i for p, i in self._taken_from.items() if p in self._waiting}
        if self._settle is not None and runs:
            self._settle(runs)
        dead = self.failures.dead_sent
        forwarded = sum(len(r) for _, r in runs) - len(dead) - len(self.sender.rerouted)
        for doom in dead.values():
            self._m_dead.labels(self.level.name, doom.reason).inc()
            if doom.stub:
                self._m_stubs.inc()
        self.failures.committed(runs)
        self.group.retire(runs)
        self.sender.rerouted.clear()
        if forwarded > 0:
            self._m_forwarded.inc(forwarded)
        if self.sender.lateness:
            lateness, self.sender.lateness = self.sender.lateness, []
            self._m_lateness.observe_counted(
                self.level.name, [(max(0, ms) / 1000, n) for ms, n in lateness]
            )
        self._m_commits.inc()

    def _commit_transaction(self, offsets: dict[int, int]) -> bool:
        try:
            self._txn.commit(offsets)
            return True
        except KafkaException as exc:
            error = error_of(exc)
            self._m_commit_failures.inc()
            if error is not None and (is_fatal(error) or error.code() in FENCED):
                raise producer_failed(error, f"{self.level.topic}: commit_transaction") from exc
            group_moved = isinstance(error, KafkaError) and error.code() in GROUP_ERRORS
            log.warning(
                "%s: transaction could not commit (%s); %s",
                self.level.topic,
                error.str() if isinstance(error, KafkaError) else exc,
                "reading again from the committed offsets" if group_moved else "sending it again",
            )
            self._txn.abort()
            if group_moved:
                self._reset()
            else:
                self._requeue({})
            return False

    def _place_reports(self) -> tuple[set[Key], int]:
        reports, self.sender.reports = self.sender.reports, []
        for error, report, _ in reports:
            if error.code() in UNKNOWN_TARGET and report.topic():
                self.sender.forget_target(report.topic() or "")
        return self.failures.place(reports, self._runs, self.sender.rerouted)

    def _holds(self, again: set[Key], backoff_ms: int) -> dict[int, int]:
        """Partitions to hold back, until when (epoch ms): those with a record retried."""
        if not backoff_ms:
            return {}
        until = int(self._clock.time() * 1000) + backoff_ms
        failing = self.failures.failing
        return {partition: until for partition, offset in again if (partition, offset) in failing}

    def _requeue(self, holds: dict[int, int]) -> None:
        """The interval goes again (its transaction was aborted, or librdkafka inferred
        a success in it): everything it held goes back to the front of its partition's
        queue, in order, and is sent again (`holds`: after a backoff)."""
        runs, self._runs = self._runs, []
        again: dict[int, list[Message]] = {}
        for partition, records in runs:
            again.setdefault(partition, []).extend(records)
        for partition, records in again.items():
            records.sort(key=offset_of)  # a record sent again on its own came after later ones
            committed = self._committed.get(partition)
            if committed is None:
                self._sent_through.pop(partition, None)
            else:
                self._sent_through[partition] = committed
            incarnation = self._taken_from.get(partition)
            self.group.put_back(partition, records, holds.get(partition, 0), incarnation)
        self._taken_from = {p: i for p, i in self._taken_from.items() if p in self._waiting}
        self.failures.dead_sent.clear()
        self.sender.rerouted.clear()
        self.sender.lateness = []

    def _set_aside(self, again: set[Key], backoff_ms: int) -> None:
        """At-least-once: the records to send again leave the interval and wait on their
        own (the rest of their partition goes on; its commits stop below them)."""
        until = int(self._clock.time() * 1000)
        failing = self.failures.failing
        kept: Runs = []
        for partition, records in self._runs:
            stay = []
            for record in records:
                spot = (partition, offset_of(record))
                if spot in again:
                    wait = backoff_ms if spot in failing else 0
                    self._waiting.setdefault(partition, {})[spot[1]] = (until + wait, record)
                    self.failures.dead_sent.pop(spot, None)
                    self.sender.rerouted.pop(spot, None)
                else:
                    stay.append(record)
            if stay:
                kept.append((partition, stay))
        self._runs = kept
        self._waiting_changed()

    def _send_waiting(self) -> None:
        """At-least-once: send the records set aside whose backoff is over."""
        now_ms = int(self._clock.time() * 1000)
        due = sorted(
            (partition, offset)
            for partition, held in self._waiting.items()
            for offset, (until, _) in held.items()
            if until <= now_ms
        )
        if not due:
            return
        try:
            for partition, offset in due:
                held = self._waiting[partition]
                _, record = held[offset]
                if self.sender.send_run(partition, [record]) == 1:
                    del held[offset]
                    self._runs.append((partition, [record]))
                    if not held:
                        del self._waiting[partition]
                else:
                    held[offset] = (self._retry_hold_ms(), record)
        finally:  # a record still held waits on: what raised did not send it for sure,
            self._waiting_changed()  # and the next pass tries it again

    def _waiting_changed(self) -> None:
        self.set_aside_due_ms = min(
            (
                self.group.due_of(partition, record)
                for partition, held in self._waiting.items()
                for _, record in held.values()
            ),
            default=None,
        )
