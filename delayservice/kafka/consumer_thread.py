"""The life of a thread that owns one consumer, shared by the level consumer loop and
the precise intake: what each does about a broker that is down, a client made unusable,
an iteration that raised, and the broker's answer to a commit.

Both read records whose offsets they commit only once the records are safe elsewhere,
so both survive the same way: a fatal client is replaced (`ConsumerKeeper`), an
iteration that raised is logged, counted and followed by `_recover`, which reads again
whatever the failed iteration had not made safe, and the loop goes on. Only the
subclass knows what it reads and how it goes back; only this class runs the loop.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Final, Protocol

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from delayservice.kafka.client_errors import is_fatal, raised_by, told
from delayservice.kafka.consumer_keeper import ConsumerKeeper
from delayservice.log_throttle import Throttle
from delayservice.metrics.heartbeat import STUCK_S, Heartbeat

log = logging.getLogger(__name__)

ERROR_PAUSE_S: Final = 0.5
"""How long the loop waits after an iteration raised, so that a fault that repeats
(a broker away) costs a few lines a second, not a busy loop."""


class _Count(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class ConsumerThread(ABC):
    def __init__(
        self,
        label: str,
        thread_name: str,
        on_fatal: Callable[[str], None],
        *,
        loop_errors: _Count,
        commits: _Count,
        commit_failures: _Count,
    ) -> None:
        """`label` names the thread's work in log lines; `on_fatal` stops the daemon
        when the thread cannot go on (its client keeps failing, it cannot start)."""
        self._label = label
        self._on_fatal = on_fatal
        self._m_loop_errors = loop_errors
        self._m_commits = commits
        self._m_commit_failures = commit_failures
        self._throttle = Throttle()
        self._stopping = threading.Event()
        self.broker_down = False
        """librdkafka said every broker is down; cleared by the next record or probe."""
        self.heartbeat = Heartbeat()
        """Beats once per turn of the loop (`stuck`)."""
        self._failing: tuple[float, str] | None = None
        """Since when every turn has raised, and what the last turn raised (`stuck`): its
        text, not the exception, whose frames could hold that turn's batch."""
        self._thread = threading.Thread(target=self._main, name=thread_name, daemon=True)

    # -- what a subclass provides --------------------------------------------------
    @abstractmethod
    def _open(self) -> ConsumerKeeper:
        """Runs first on the thread: the keeper of its client, subscribed or assigned."""

    @abstractmethod
    def _iteration(self) -> None:
        """One turn of the loop: read, hand on, commit."""

    @abstractmethod
    def _shutdown(self) -> None:
        """Runs after the loop: the last commit, then close the client."""

    def _recover(self) -> None:  # noqa: B027  (optional: nothing to go back to by default)
        """After an iteration raised: go back to what it had read but not made safe."""

    def _replaced(self) -> None:  # noqa: B027  (optional)
        """After the client was replaced: forget what only the old client knew."""

    _replace_hint = ""
    """Appended to the log line when replacing the client keeps failing."""

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def request_stop(self) -> None:
        self._stopping.set()

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stuck(self, limit_s: float = STUCK_S) -> str | None:
        """Why readiness should say this thread is not moving, or None: one turn of its
        loop (a read, a rebalance callback, a commit) has lasted longer than `limit_s`,
        or every turn has raised for that long (a turn that raised goes back to what it
        had not made safe, so such a thread reads nothing new: a callback of the client
        that always fails, say)."""
        if not self._thread.is_alive() or self._stopping.is_set():
            return None
        still = self.heartbeat.still_s()
        if still > limit_s:
            return f"{self._label}: one turn of the consumer thread has lasted {still:.0f}s"
        failing = self._failing
        if failing is not None and time.monotonic() - failing[0] > limit_s:
            return (
                f"{self._label}: every turn of the consumer thread has failed for "
                f"{time.monotonic() - failing[0]:.0f}s, the last with {failing[1]}"
            )
        return None

    def on_error(self, error: KafkaError) -> None:
        """librdkafka's error callback; runs on this thread during a read."""
        code = error.code()
        if code == KafkaError._ALL_BROKERS_DOWN:
            self.broker_down = True
        if is_fatal(error):
            self._fail(error.str())  # replaced at the loop's next turn
        elif self._throttle.allow(("client", code)) is not None:
            level = logging.WARNING if code == KafkaError._ALL_BROKERS_DOWN else logging.INFO
            log.log(level, "%s: %s; retrying", self._label, error.str())

    def _fail(self, reason: str) -> None:
        keeper = self._kept()
        if keeper is not None:
            keeper.fail(reason)

    @abstractmethod
    def _kept(self) -> ConsumerKeeper | None:
        """The keeper, once `_open` made it."""

    # -- the loop ------------------------------------------------------------------
    def _main(self) -> None:
        try:
            keeper = self._open()
        except Exception as exc:
            log.exception("%s: the consumer could not start", self._label)
            self._on_fatal(f"{self._label}: the consumer could not start: {exc}")
            return
        self._loop(keeper)
        try:
            self._shutdown()
        except Exception:
            log.exception("%s: shutdown failed; uncommitted records will be re-read", self._label)

    def _loop(self, keeper: ConsumerKeeper) -> None:
        going: list[bool] = []  # what the last turn returned
        while not self._stopping.is_set():
            self.heartbeat.beat()
            going.clear()
            raised = raised_by(lambda: going.append(self._turn(keeper)))
            if raised is None:
                self._failing = None
            else:
                self._failing = (
                    time.monotonic() if self._failing is None else self._failing[0],
                    told(raised),
                )
            if going == [False] or (raised is not None and not self._failed(keeper, raised)):
                return

    def _turn(self, keeper: ConsumerKeeper) -> bool:
        """One iteration; False when the client could not be replaced (`on_fatal`: the
        daemon is stopping)."""
        if keeper.failed is not None and not self._replace_client(keeper):
            return False
        self._iteration()
        return True

    def _failed(self, keeper: ConsumerKeeper, exc: Exception) -> bool:
        """An iteration that raised; False stops the loop."""
        if isinstance(exc, KafkaException):
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and is_fatal(error):
                keeper.fail(error.str())
                return True
            self._kafka_error(exc, error if isinstance(error, KafkaError) else None)
            return True
        return self._unexpected(exc)

    def _replace_client(self, keeper: ConsumerKeeper) -> bool:
        """Replace a client that hit a fatal error; False when that keeps happening."""
        if not keeper.replace(self._replace_hint):
            return False
        self._replaced()
        return True

    def _kafka_error(self, exc: KafkaException, error: KafkaError | None) -> None:
        """A Kafka error the client survives: by default, like any other."""
        self._survive(exc)

    def _unexpected(self, exc: Exception) -> bool:
        """Any other exception of an iteration; False stops the loop."""
        self._survive(exc)
        return True

    def _survive(self, exc: Exception) -> None:
        """Log it, count it, go back to what the iteration had not made safe, go on."""
        self._m_loop_errors.inc()
        log.error("%s: %r; continuing", self._label, exc, exc_info=exc)
        self._recover()
        self._stopping.wait(ERROR_PAUSE_S)

    # -- commit answers ------------------------------------------------------------
    def _answered(
        self, error: KafkaError | None, partitions: list[TopicPartition] | None
    ) -> tuple[list[TopicPartition], list[TopicPartition]]:
        """The broker's answer to a commit, split into what it confirmed and what failed
        (everything, when the whole request failed), counted and logged. Only confirmed
        offsets count as committed; the rest is asked again at the next commit."""
        given = partitions or []
        if error is not None and error.code() == KafkaError._NO_OFFSET:
            return [], []  # nothing was asked for
        if error is not None:
            done: list[TopicPartition] = []
            failed = list(given)
        else:
            done = [tp for tp in given if tp.error is None and tp.offset >= 0]
            failed = [tp for tp in given if tp.error is not None]
        if done:
            self._m_commits.inc()
        if error is not None or failed:
            self._m_commit_failures.inc()
            reason = error if error is not None else failed[0].error
            if self._throttle.allow("commit") is not None:
                log.warning(
                    "%s: commit failed (%s); trying again",
                    self._label,
                    reason.str() if reason is not None else "?",
                )
        return done, failed
