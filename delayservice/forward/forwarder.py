"""The forwarder thread: sends due records, and commits like Kafka Streams.

One forwarder serves every delay topic its worker reads (one level, several levels,
or a precise topic), through one producer and, exactly-once, one transaction. It
sleeps on the buffer's condition until the earliest partition head is due or the next
commit point, and is woken early when an earlier head arrives. Each due record is sent
as it is (key, value, the user's headers plus `delay-id` and `delay-due-ms`), with no
delivery callback of its own: the producer reports only failures.

At each commit point (every `commit_interval`, sooner once nothing is due, but never
more often than `floor`) the forwarder makes what it sent durable, then moves each
partition's committable offset to the one after the last record sent
(`open_interval.OpenInterval` keeps all of that):

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

Precise mode forwards through this forwarder too, over its own buffer
(`forward.buffer.Buffer`): each commit point hands the records it made durable to
`settle`, which settles them in their slots (`precise.settle.settle_durable`).
Exactly-once, its transactions carry no consumer offsets but a `ledger`'s record of
what they delivered (`transaction_ledger`), learned again after every
init_transactions; an unknown outcome then puts the interval back in the buffer,
where what the ledger says committed is settled unsent.

No exception from one record escapes a send; the loop survives anything else.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException

from delayservice.forward import dead_letter as dl
from delayservice.forward.buffer import TP, Buffer, Runs
from delayservice.forward.failures import UNKNOWN_TARGET, Failures, Key
from delayservice.forward.open_interval import OpenInterval
from delayservice.forward.sender import (
    FENCED,
    ForwarderFatalError,
    RecordSender,
    Routes,
    SendLaterError,
    producer_failed,
)
from delayservice.forward.transaction import Transaction
from delayservice.forward.transaction_ledger import TransactionLedger
from delayservice.kafka.client_errors import (
    error_of,
    fatal_error_in,
    is_fatal,
    lost_client_error,
    raised_by,
)
from delayservice.kafka.target_topics import TargetTopics
from delayservice.kafka.unconfirmed_acks import UnconfirmedAcks
from delayservice.levels import Level
from delayservice.log_throttle import Throttle
from delayservice.metrics.heartbeat import Heartbeat
from delayservice.metrics.service_metrics import COMMIT_STEPS, ServiceMetrics

__all__ = ["Forwarder", "ForwarderFatalError", "Routes", "SharedId", "commit_floor"]

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
    partitions: set[TP]
    commit: bool
    done: threading.Event = field(default_factory=threading.Event)
    offsets: dict[TP, int] = field(default_factory=dict)
    ok: bool = False


@dataclass(frozen=True)
class SharedId:
    """Two holders of the same partitions forward under one transactional id, so the
    coordinator lets one of them commit at a time (precise mode with two copies: the
    owner, and its replica when it takes over). Being fenced by the other is then part
    of the protocol, not a sign of a second live process with this instance's name: it
    does not count towards `REBUILDS`. `lazy`: the holder that takes over inits its
    producer only when it has something to send (`ensure_transaction`), and once
    fenced holds off for `hold_back_s`, so that the owner, back, goes on first."""

    other: str
    lazy: bool = False
    hold_back_s: float = 0.0


class Forwarder:
    def __init__(
        self,
        levels: Sequence[Level],
        group: Buffer,
        producer: Any,
        targets: TargetTopics,
        routes: Routes,
        metrics: ServiceMetrics,
        on_fatal: Callable[[str], None],
        *,
        name: str,
        transactional: bool,
        unconfirmed: UnconfirmedAcks,
        commit_interval_s: float,
        flush_timeout_s: float,
        backoff: tuple[float, float] = (1.0, 30.0),
        give_up_s: float = 300.0,
        clock: Any = time,
        make_producer: Callable[[], Any] | None = None,
        settle: Callable[[Runs], None] | None = None,
        ledger: TransactionLedger | None = None,
        shared_id: SharedId | None = None,
    ) -> None:
        """`levels`: the delay topics it forwards (their records come from `group`);
        `name`: its worker's, for threads, messages and the per-worker metrics.
        `producer` is its own, built with `on_delivery=self.on_report` and
        `delivery.report.only.error` (and a `transactional.id` when `transactional`),
        its log lines going through `unconfirmed` (`watch_unconfirmed`). `settle` is
        handed, at each commit point, the records it made durable (precise mode settles
        them in its slots; see `PreciseWorker`). `ledger` (exactly-once, precise mode):
        what the transactions carry instead of consumer offsets. `shared_id`: another
        holder uses its transactional id too, by design (see `SharedId`)."""
        self.levels = {level.topic: level for level in levels}
        self.name = name
        self.group = group
        self._producer = producer
        self._make_producer = make_producer
        self._rebuilds: deque[float] = deque()
        self._on_fatal = on_fatal
        self.transactional = transactional
        self._unconfirmed = unconfirmed
        self._interval = commit_interval_s
        self._floor = commit_floor(commit_interval_s)
        self._flush_timeout = flush_timeout_s
        self._clock = clock
        self._settle = settle
        self._ledger = ledger
        self._shared = shared_id
        self._held_back_until = 0.0
        self._metrics = metrics
        self._m_forwarded = {t: metrics.forwarded.labels(lv.name) for t, lv in self.levels.items()}
        self._m_stubs = {
            t: metrics.dead_letter_stubs.labels(lv.name) for t, lv in self.levels.items()
        }
        for level in levels:
            metrics.lateness.labels(level.name)
            for reason in dl.REASONS:
                metrics.dead_lettered.labels(level.name, reason)
        self._m_loop_errors = metrics.loop_errors.labels(name, "forwarder")
        self._m_commits = metrics.commits.labels(name)
        self._m_commit_failures = metrics.commit_failures.labels(name)
        self._m_steps = {
            step: metrics.commit_step_seconds.labels(name, step) for step in COMMIT_STEPS
        }
        self.failures = Failures(
            routes.dead_letter_topic, backoff, give_up_s, self._count_retry, clock.monotonic
        )
        self._stopping = threading.Event()
        self.interval = OpenInterval(group)
        """What was sent since the last commit point."""
        self.sender = RecordSender(
            self.levels,
            group,
            producer,
            targets,
            routes,
            metrics,
            self.failures,
            self._stopping,
            clock,
            name,
            self.interval,
        )
        self.on_report = self.sender.on_report
        """The producer's delivery callback (`on_delivery`): failures only."""
        self.set_aside_due_ms: int | None = None
        """The earliest due time among the records set aside for a backoff, for the
        consumer thread's gauges: a record waiting out a backoff is held, and overdue."""
        self.set_aside_due_by_topic: dict[str, int] = {}
        """The same, per level topic."""
        self._reseek = threading.Event()
        """Set while the consumer thread is to drop the queues and seek back to the
        committed offsets (`reseek_wanted`); nothing is taken meanwhile."""
        self._txn = Transaction(
            name,
            producer,
            self._stopping,
            clock,
            self._step_spent,
            ledger.learn if ledger is not None else None,
        )
        # progress_at: when a commit point last made records durable (`stalled`).
        self._last_commit = self.progress_at = clock.monotonic()
        self.heartbeat = Heartbeat(clock.monotonic)
        """Beats once per turn of the send loop (`stalled` says when one lasts)."""
        self._throttle = Throttle()
        # Shared with the consumer thread.
        self._lock = threading.Lock()
        self._durable: dict[TP, int] = {}
        self._requests: list[_Request] = []
        self._thread = threading.Thread(target=self._main, name=f"forwarder-{name}", daemon=True)

    def _count_retry(self, error: str, spot: Key) -> None:
        self._metrics.forward_errors.labels(self.levels[spot[0]].name, error).inc()

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

    def take_durable(self) -> dict[TP, int]:
        """Offsets made durable since the last call (at-least-once), for the consumer
        thread to commit."""
        with self._lock:
            durable, self._durable = self._durable, {}
        return durable

    def handover(self, partitions: set[TP], *, commit: bool) -> dict[TP, int] | None:
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
                        self.name,
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
        sent = [due_of(tp, records[0]) for tp, records in list(self.interval.runs) if records]
        held = [ms for ms in (self.group.earliest_held_ms(), self.set_aside_due_ms) if ms]
        held += sent  # sent and not yet durable: as good as held
        if not held:
            return None
        overdue_s = clock.time() - min(held) / 1000
        if overdue_s <= budget_s:
            return None
        step_s = self.heartbeat.still_s()
        within = f"; one step has lasted {step_s:.0f}s" if step_s > budget_s else ""
        return (
            f"nothing forwarded for {idle_s:.0f}s while records are due "
            f"(the oldest {overdue_s:.0f}s ago){within}"
        )

    def reseek_wanted(self) -> bool:
        """Whether the consumer thread is to drop the queues and seek every owned
        partition back to its committed offset, then call `reseek_done`."""
        return self._reseek.is_set()

    def reseek_done(self) -> None:
        self._reseek.clear()
        self.group.wake()

    def ensure_transaction(self) -> float:
        """A lazy forwarder (`SharedId.lazy`), on its own thread, about to send: init
        its producer (fencing the other holder) and learn, and return 0; or, fenced
        lately, the seconds it still holds off. Raises as `Transaction.init`."""
        left = float(self._held_back_until - self._clock.monotonic())
        if left > 0:
            return left
        self._txn.init()
        return 0.0

    # -- the loop ------------------------------------------------------------------
    def _main(self) -> None:
        if self.transactional and not (self._shared is not None and self._shared.lazy):
            try:
                self._txn.init()
            except SendLaterError as exc:  # tried again before the first send
                log.info("%s: %s; trying again before the first send", self.name, exc)
            except ForwarderFatalError as exc:
                if exc.fenced:  # another live instance holds this transactional id
                    self._on_fatal(str(exc))
                    return
                log.warning("%s: %s; the send loop takes it from here", self.name, exc)
        try:
            self._run()
        except ForwarderFatalError as exc:
            self._on_fatal(str(exc))
            return
        failed = raised_by(self._commit_point)
        if isinstance(failed, ForwarderFatalError):
            self._on_fatal(str(failed))
        elif failed is not None:
            log.error("%s: last commit failed; records will be re-read", self.name, exc_info=failed)
        with self._lock:
            requests, self._requests = self._requests, []
        for request in requests:
            self._serve(request)

    def _run(self) -> None:
        while not self._stopping.is_set():
            self.heartbeat.beat()
            raised = raised_by(lambda: self.step(wait=True))
            if isinstance(raised, ForwarderFatalError):
                raise raised
            if isinstance(raised, SendLaterError):  # the transaction coordinator is not there yet
                if self._throttle.allow("later") is not None:
                    log.warning("%s: %s; trying again", self.name, raised)
                self._stopping.wait(0.5)
            elif raised is not None:
                self._m_loop_errors.inc()
                log.error("forwarder %s: unexpected error; continuing", self.name, exc_info=raised)
                self._stopping.wait(0.5)

    def step(self, *, wait: bool = False, commit: bool = False) -> None:
        """One pass of the loop: sleep until something is due (`wait`), send what is due,
        and reach a commit point when one is due (or when `commit`, for tests). A
        producer that failed for good is replaced here (`rebuild_producer`)."""
        raised = raised_by(lambda: self._step(wait=wait, commit=commit))
        if isinstance(raised, ForwarderFatalError):
            self.rebuild_producer(raised)
        elif raised is not None:
            self._step_failed(raised)

    def _step_failed(self, exc: Exception) -> None:
        """A fatal error anywhere in the step replaces the producer; anything else is
        raised again, a lost error as `SendLaterError`."""
        error = fatal_error_in(exc)
        if error is None and lost_client_error(exc):
            # At a fence, while flush served the callbacks: the next call says why.
            # Counted, so that one that keeps coming shows beside the WARNING.
            self._m_loop_errors.inc()
            raise SendLaterError("a producer call lost its error") from exc
        if error is None:
            raise exc
        failure = producer_failed(error, f"{self.name}: {type(exc).__name__}")
        self.rebuild_producer(failure)

    def _step(self, *, wait: bool, commit: bool) -> None:
        clock = self._clock
        interval = self.interval
        self._serve_requests()
        if wait:
            busy = interval or self._ledger_pending()
            deadline = self._last_commit + self._floor if busy else float("inf")
            until = clock.time() + max(0.0, deadline - clock.monotonic())
            waiting_ms = interval.waiting_until_ms()
            if waiting_ms is not None:
                until = min(until, waiting_ms / 1000)
            self.group.wait(until)
            if self._stopping.is_set():
                return
            self._serve_requests()
        if self._reseek.is_set():  # the queues are stale until the consumer thread seeks
            self._stopping.wait(RESEEK_POLL_S)
            return
        if self._ledger is not None and not (self._shared is not None and self._shared.lazy):
            self._txn.init()  # learns what committed before anything is taken
        if interval.waiting:
            self._send_waiting()
        runs = self.group.take(TAKE)
        if runs:
            try:
                self._send_runs(runs)
            finally:
                self.group.settle()
            self.sender.poll(0)
        if self.sender.markers_waiting():
            self._serve_markers()
        since = clock.monotonic() - self._last_commit
        if commit or (
            # An open transaction with nothing in it is ended too: one turned abortable
            # before anything was sent refuses every produce() until it is aborted.
            (interval or self._ledger_pending() or self._txn.open)
            and (
                since >= self._interval
                or interval.reports
                or (since >= self._floor and self._idle())
            )
        ):
            self._commit_point()

    def _ledger_pending(self) -> bool:
        return self._ledger is not None and self._ledger.pending()

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
                self._hand_over(request)
            except ForwarderFatalError:
                raise
            except Exception as exc:
                self._m_loop_errors.inc()
                if lost_client_error(exc):  # at a fence, as in `step`: no trace to show
                    log.warning(
                        "%s: handing over %s: a producer call lost its error (%s)",
                        self.name,
                        sorted(gone),
                        exc,
                    )
                else:
                    log.exception("%s: handing over %s failed", self.name, sorted(gone))
                request.ok = False
                self._end_transaction()
        except ForwarderFatalError as exc:
            request.ok = False
            self.interval.drop(gone)  # never sent again, whatever happens next
            try:
                self.rebuild_producer(exc)
            except ForwarderFatalError as final:
                self._on_fatal(str(final))
        finally:
            self._forget(gone)
            request.done.set()

    def _hand_over(self, request: _Request) -> None:
        """`_serve`'s commit or drop; a bare `KafkaError` comes out as the exception
        it should have been (`client_errors.raised_by`), handled as that would be."""
        gone = request.partitions

        def commit_or_drop() -> None:
            if request.commit:
                request.ok = self._commit_point()
            else:
                self._abandon(gone)
                request.ok = True

        raised = raised_by(commit_or_drop)
        if raised is not None:
            raise raised
        committed = self.interval.committed
        request.offsets = {tp: o for tp, o in committed.items() if tp in gone}

    def _end_transaction(self) -> None:
        """Abort the open transaction (its records go again from the queues); raises
        `ForwarderFatalError` when even that fails (the producer is then fenced)."""
        if self.transactional and self._txn.open:
            self._txn.abort()
            self.interval.requeue({})

    def _forget(self, tps: set[TP]) -> None:
        self.group.drop(tps)
        self.failures.forget(tps)
        self.interval.forget(tps)
        self._waiting_changed()
        with self._lock:
            for tp in tps:
                self._durable.pop(tp, None)

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
        shared = self._shared if failure.fenced else None
        if self._make_producer is None or (shared is None and len(self._rebuilds) >= REBUILDS):
            raise failure
        if shared is None:
            self._rebuilds.append(now)
            log.error("%s: %s; replacing the producer", self.name, failure)
        else:
            log.warning("%s: fenced by %s; replacing the producer", self.name, shared.other)
        self.interval.reports.clear()
        self._unconfirmed.take()  # the interval goes again anyway
        if self.transactional:
            self._reset()  # its transaction's outcome is unknown: nothing from memory
        else:
            self.interval.requeue({})
        old = self._producer
        try:
            old.purge()
        except Exception as exc:  # a failed client may refuse even this
            log.warning("%s: purging the failed producer: %s", self.name, exc)
        self._producer = self._make_producer()
        self.sender.replace_producer(self._producer)
        self._txn.replace(self._producer)
        if shared is not None and shared.lazy:  # the owner is back: let it go on first
            self._held_back_until = now + shared.hold_back_s
            return
        if self.transactional:
            try:  # fence now: the old transaction ends (committed or aborted) at once
                self._txn.init()
            except (SendLaterError, ForwarderFatalError) as exc:  # the next send tries again
                log.warning("%s: %s; fencing at the next send", self.name, exc)

    def _reset(self) -> None:
        """After an unknown outcome or a group error, as Kafka Streams does: nothing held
        in memory is sent again. The interval and the queues are dropped and the
        consumer thread seeks every owned partition back to its committed offset, which
        says what the transaction did; until then nothing is taken. With a `ledger` the
        interval goes back to the buffer instead: the ledger, learned again after the
        fence, says which of its records committed."""
        if self._ledger is not None:
            self.interval.requeue({})
            self._waiting_changed()
            return
        self._reseek.set()
        self.interval.reset()
        self._waiting_changed()

    def _abandon(self, tps: set[TP]) -> None:
        """Lost partitions: nothing of theirs may commit. In exactly-once the open
        transaction holds their records, so it is aborted and the others go again."""
        if self.transactional and self._txn.open:
            self._txn.abort()
            self.interval.requeue({})
        else:
            self.interval.drop(tps)

    # -- sending -------------------------------------------------------------------
    def _send_runs(self, runs: Runs) -> None:
        interval = self.interval
        if self.transactional and not self._txn.open:
            try:
                self._txn.begin()
            except:  # a bare KafkaError too (kafka.client_errors)
                for tp, records in runs:  # taken, never sent: back where they were
                    self.group.put_back(tp, records)
                raise
        for index, (tp, taken) in enumerate(runs):
            interval.took(tp)
            try:
                sent = self.sender.send_run(tp, taken)
            except:  # a bare KafkaError too (kafka.client_errors)
                self._unsent(runs[index:])
                raise
            records = taken
            if sent < len(taken):
                # The rest of this partition waits (metadata unreachable, or a stop while
                # the producer's queue is full); a stop hands back every later run too.
                hold = 0 if self._stopping.is_set() else self._retry_hold_ms()
                interval.put_back(tp, taken[sent:], hold)
                records = taken[:sent]
            if records:
                interval.add(tp, records)
            if sent < len(taken) and self._stopping.is_set():
                for later, rest in runs[index + 1 :]:
                    self.group.put_back(later, rest)
                return

    def _serve_markers(self) -> None:
        """Level mode: answer new markers and move their messages now (in the open
        transaction, exactly-once; `level.marker_actions`)."""
        self.sender.serve_markers(self._begin)

    def _begin(self) -> None:
        if self.transactional and not self._txn.open:
            self._txn.begin()

    def _unsent(self, runs: Runs) -> None:
        """A send raised past the sender (a producer gone fatal, or a bug): which records
        of the first run went out is unknown, so it goes back whole with every run after
        it, and nothing it held is lost. Under exactly-once the open transaction may
        hold some of them: it is aborted and the whole interval goes again, so a
        read_committed reader still sees each record once (at-least-once: those that
        went out may arrive twice). A failed abort raises, and the producer is fenced."""
        for tp, records in reversed(runs):
            self.interval.put_back(tp, records)
        if self.transactional and self._txn.open:
            self._end_transaction()

    def _retry_hold_ms(self) -> int:
        return int(self._clock.time() * 1000) + self.failures.backoff_ms(1)

    # -- commit points -------------------------------------------------------------
    def _commit_point(self) -> bool:
        """Make the interval durable and move the committable offsets; False when it
        could not (it is tried again, or sent again, from the same offsets)."""
        interval = self.interval
        self._last_commit = self._clock.monotonic()
        if not interval and not self._txn.open:
            if not self._ledger_pending():
                return True
            self._txn.begin()
        remaining = self.sender.flush(self._flush_timeout)
        self._step_spent("flush", self._clock.monotonic() - self._last_commit)
        if remaining:
            self._m_commit_failures.inc()
            log.warning(
                "%s: %d forwards unacknowledged after %.0fs; not committing yet",
                self.name,
                remaining,
                self._flush_timeout,
            )
            if self.transactional:
                self._txn.abort()
                interval.requeue({})
            return False
        self.sender.poll(0)  # log lines queued behind the last report
        if self._resent_unconfirmed():
            return False
        if interval.reports:
            again, backoff_ms = self._place_reports()
            if self.transactional:
                self._txn.abort()
                interval.requeue(self._holds(again, backoff_ms))
                return False
            interval.set_aside(
                again, self.failures.failing, int(self._clock.time() * 1000), backoff_ms
            )
            self._waiting_changed()
        offsets = interval.committable()
        if self._ledger is not None:
            if not (self._ledger_written() and self._commit_transaction({})):
                return False
            self._ledger.committed()
        elif self.transactional:
            offsets = interval.fenced(offsets)
            if not self._commit_transaction(offsets):
                return False
        else:
            with self._lock:
                self._durable.update(offsets)
        self._settled(offsets)
        return True

    def _step_spent(self, step: str, seconds: float) -> None:
        self._m_steps[step].observe(seconds)

    def _resent_unconfirmed(self) -> bool:
        """When librdkafka inferred a success in this interval, nothing of it commits:
        everything goes again (exactly-once: after an abort, so readers see it once)."""
        inferred, line = self._unconfirmed.take()
        if not inferred:
            return False
        interval = self.interval
        by_topic = Counter[str]()
        for tp, records in interval.runs:
            by_topic[tp[0]] += len(records)
        for topic, count in by_topic.items():
            self._metrics.forward_errors.labels(self.levels[topic].name, UNCONFIRMED).inc(count)
        held_back = self._throttle.allow(UNCONFIRMED)
        if held_back is not None:
            log.warning(
                "%s: librdkafka inferred a delivery the broker did not confirm (%s); "
                "sending the %d records since the last commit again%s",
                self.name,
                line,
                by_topic.total(),
                f" ({held_back} more times since the last line)" if held_back else "",
            )
        interval.reports.clear()
        if self.transactional:
            self._txn.abort()
        interval.requeue({})
        return True

    def _settled(self, offsets: dict[TP, int]) -> None:
        """The interval is durable and `offsets` committed: count it, and start anew."""
        self.progress_at = self._clock.monotonic()
        interval = self.interval
        forwarded = Counter[str]()
        for doom_spot, doom in interval.dead_sent.items():
            forwarded[doom_spot[0]] -= 1
            self._metrics.dead_lettered.labels(self.levels[doom_spot[0]].name, doom.reason).inc()
            if doom.stub:
                self._m_stubs[doom_spot[0]].inc()
        for spot in (*interval.rerouted, *interval.withdrawn):
            forwarded[spot[0]] -= 1
        lateness = interval.take_lateness()
        runs = interval.settle(offsets)
        if self._settle is not None and runs:
            self._settle(runs)
        for tp, records in runs:
            forwarded[tp[0]] += len(records)
        self.failures.committed(runs)
        self.group.retire(runs)
        for topic, count in forwarded.items():
            if count > 0:
                self._m_forwarded[topic].inc(count)
        for topic, pairs in lateness.items():
            if pairs:
                self._metrics.lateness.observe_counted(
                    self.levels[topic].name, [(max(0, ms) / 1000, n) for ms, n in pairs]
                )
        self._m_commits.inc()

    def _ledger_written(self) -> bool:
        """The delivery record goes into the transaction. One the broker made abortable
        meanwhile (its coordinator's timeout, after a stall) refuses it with `_STATE`:
        raised past the commit point, no abort ever came and the interval stayed unsent
        for good. It is aborted and sent again, as a failed commit is."""
        assert self._ledger is not None
        try:
            self._ledger.write(self._producer, self.interval.runs)
        except KafkaException as exc:
            error = error_of(exc)
            if not self.transactional or error is None or error.code() != KafkaError._STATE:
                raise
            self._m_commit_failures.inc()
            log.warning(
                "%s: the transaction was refused its delivery record (%s); sending it again",
                self.name,
                error.str(),
            )
            self._end_transaction()
            return False
        return True

    def _commit_transaction(self, offsets: dict[TP, int]) -> bool:
        try:
            self._txn.commit(offsets)
            return True
        except KafkaException as exc:
            error = error_of(exc)
            self._m_commit_failures.inc()
            if error is not None and (is_fatal(error) or error.code() in FENCED):
                raise producer_failed(error, f"{self.name}: commit_transaction") from exc
            group_moved = error is not None and error.code() in GROUP_ERRORS
            log.warning(
                "%s: transaction could not commit (%s); %s",
                self.name,
                error.str() if error is not None else exc,
                "reading again from the committed offsets" if group_moved else "sending it again",
            )
            if group_moved:
                self._txn.abort()
                self._reset()
            else:
                self._end_transaction()
            return False

    def _place_reports(self) -> tuple[set[Key], int]:
        interval = self.interval
        reports, interval.reports = interval.reports, []
        for error, report, _ in reports:
            if error.code() in UNKNOWN_TARGET and report.topic():
                self.sender.forget_target(report.topic() or "")
        return self.failures.place(reports, interval.runs, interval.rerouted, interval.dead_sent)

    def _holds(self, again: set[Key], backoff_ms: int) -> dict[TP, int]:
        """Partitions to hold back, until when (epoch ms): those with a record retried."""
        if not backoff_ms:
            return {}
        until = int(self._clock.time() * 1000) + backoff_ms
        failing = self.failures.failing
        return {(spot[0], spot[1]): until for spot in again if spot in failing}

    def _send_waiting(self) -> None:
        """At-least-once: send the records set aside whose backoff is over."""
        interval = self.interval
        now_ms = int(self._clock.time() * 1000)
        due = sorted(
            (tp, offset)
            for tp, held in interval.waiting.items()
            for offset, (until, _) in held.items()
            if until <= now_ms
        )
        if not due:
            return
        try:
            for tp, offset in due:
                held = interval.waiting[tp]
                _, record = held[offset]
                if self.sender.send_run(tp, [record]) == 1:
                    del held[offset]
                    interval.add(tp, [record])
                    if not held:
                        del interval.waiting[tp]
                else:
                    held[offset] = (self._retry_hold_ms(), record)
        finally:  # a record still held waits on: what raised did not send it for sure,
            self._waiting_changed()  # and the next pass tries it again

    def _waiting_changed(self) -> None:
        by_topic: dict[str, int] = {}
        for tp, held in self.interval.waiting.items():
            for _, record in held.values():
                due = self.group.due_of(tp, record)
                if due < by_topic.get(tp[0], due + 1):
                    by_topic[tp[0]] = due
        self.set_aside_due_by_topic = by_topic
        self.set_aside_due_ms = min(by_topic.values(), default=None)
