"""One level's transactional producer, driven the way Kafka Streams' `StreamsProducer`
drives its own: init once per producer, begin, send the offsets with the group's
metadata, commit, abort, replace.

The forwarder decides what a failure means for the records (`Forwarder`); this
module keeps the calls honest about what librdkafka does:

- `init_transactions` is run at start and right after a producer is replaced: it fences
  the predecessor, whose open transaction would otherwise hold its offset commit and
  make a read_committed offset fetch wait.
- `send_offsets_to_transaction` can block past its own timeout while a group
  coordinator is down (librdkafka #5456); init and send-offsets run guarded, and a
  stuck call means the producer cannot be trusted any more.
- A `commit_transaction` that fails with a retriable error is retried as a commit: the
  commit may be going on in the background, an abort would be refused (`_CONFLICT`),
  and sending the interval again could duplicate it. When it keeps failing, its
  outcome is unknown, and the caller fences the producer.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from delayservice.forward.buffer import TP
from delayservice.forward.send_errors import ForwarderFatalError, SendLaterError, producer_failed
from delayservice.kafka.client_errors import error_of, is_fatal, raised_as_exception

log = logging.getLogger(__name__)

TXN_TIMEOUT_S: Final = 10.0
SEND_OFFSETS_TIMEOUT_S: Final = 2.5
"""Normally milliseconds. After a broker restart the call could hang past any timeout
(librdkafka #5456), and every level sat out the whole guard (15 s at the transaction
timeout) before its producer was replaced: exactly-once records were 26-28 s late at
p99 in the broker-restart scenario against 9.6 s at-least-once. A call that merely runs
out of time raises a retriable error, and the interval goes again."""
GUARD_SLACK_S: Final = 5.0
COMMIT_RETRY_S: Final = 30.0
"""How long a commit that keeps failing with a retriable error is retried as a commit.
Past this (or `COMMIT_ATTEMPTS`), its outcome is unknown and the producer is fenced."""
COMMIT_ATTEMPTS: Final = 20
COMMIT_RETRY_PAUSE_S: Final = 0.05
ABORT_ATTEMPTS: Final = 6
"""How many times an abort that runs out of time is resumed (librdkafka: "retry call to
resume"), at `TXN_TIMEOUT_S` each, before the producer is given up. With a broker frozen
for 35 s under a full backlog, replacing the producer at the first timeout left a new
one that could not init either, the old one destroyed in the middle of its abort, and a
re-read with every partition lost; resumed, the abort ends once the broker is back and
the interval goes again from memory."""


class Transaction:
    """Owned by the forwarder thread, like the producer it drives."""

    def __init__(
        self,
        name: str,
        producer: Any,
        stopping: threading.Event,
        clock: Any,
        spent: Callable[[str, float], None],
        learn: Callable[[], None] | None = None,
        group_metadata: Callable[[], Any] = lambda: None,
    ) -> None:
        """`learn` runs after each init_transactions until it succeeds
        (`TransactionLedger.learn`); `group_metadata` gives the consumer's, which the
        consumer thread hands over (`Inbox.group_metadata`)."""
        self.name = name
        """The forwarder's (its worker's) name, for messages."""
        self.producer = producer
        self.open = False
        self._group_metadata = group_metadata
        self._ready = False
        self._learn = learn
        self._learned = learn is None
        self._stopping = stopping
        self._clock = clock
        self._spent = spent
        """Told the seconds each commit step took (`delayservice_commit_step_seconds`)."""

    def replace(self, producer: Any) -> None:
        """A new producer takes over; its `init` fences the old one's transaction."""
        self.producer = producer
        self.open = False
        self._ready = False
        self._learned = self._learn is None

    def init(self) -> None:
        """Once per producer. Raises `SendLaterError` while the coordinator is not there
        yet, `ForwarderFatalError` when the producer cannot go on."""
        if self._ready:
            self._learned_once()
            return
        producer = self.producer
        try:
            self._guarded(
                "init_transactions",
                lambda: producer.init_transactions(TXN_TIMEOUT_S),
                TXN_TIMEOUT_S,
            )
        except KafkaException as exc:
            error = error_of(exc)
            if error is not None and is_fatal(error):
                raise producer_failed(error, f"{self.name}: init_transactions") from exc
            raise SendLaterError(f"init_transactions: {exc}") from exc
        self._ready = True
        self._learned_once()

    def _learned_once(self) -> None:
        if not self._learned and self._learn is not None:
            self._learn()
            self._learned = True

    def begin(self) -> None:
        """Raises `ForwarderFatalError` when the producer failed for good (librdkafka
        flags it fatal), `SendLaterError` for anything else (tried again later)."""
        self.init()
        try:
            self.producer.begin_transaction()
        except KafkaException as exc:
            error = error_of(exc)
            if error is not None and is_fatal(error):
                raise producer_failed(error, f"{self.name}: begin_transaction") from exc
            raise SendLaterError(f"begin_transaction: {exc}") from exc
        self.open = True

    def commit(self, offsets: dict[TP, int]) -> None:
        """Send `offsets` (delay-topic partition -> next offset) into the transaction and
        commit it. Raises `KafkaException` for an abortable or group error (the caller
        aborts) and `ForwarderFatalError` when the outcome is unknown or the producer
        failed."""
        if offsets:
            with self._timed("send_offsets"):
                self._send_offsets(offsets)
        with self._timed("commit_transaction"):
            self._commit_retrying()
        self.open = False

    @contextlib.contextmanager
    def _timed(self, step: str) -> Iterator[None]:
        started = self._clock.monotonic()
        try:
            yield
        finally:
            self._spent(step, self._clock.monotonic() - started)

    def abort(self) -> None:
        """Abort the open transaction, resuming an abort that ran out of time (it goes
        on in the background) up to `ABORT_ATTEMPTS` times. Raises `ForwarderFatalError`
        for any other failure (a lost error or a bare `KafkaError` too: left to the
        caller, the transaction was taken for ended and the interval for sent, and its
        records waited for good), or when it keeps running out of time or the worker is
        stopping: whatever the transaction's state then, it is not ours to continue; a
        new producer's init_transactions ends it, and the interval goes again."""
        if not self.open:
            return
        try:
            for attempt in range(ABORT_ATTEMPTS):
                try:
                    self.producer.abort_transaction(TXN_TIMEOUT_S)
                    return
                except KafkaException as exc:
                    error = exc.args[0] if exc.args else KafkaError(KafkaError._FAIL)
                    resumable = (
                        isinstance(error, KafkaError) and error.retriable() and not error.fatal()
                    )
                    if not resumable or attempt + 1 == ABORT_ATTEMPTS or self._stopping.is_set():
                        raise producer_failed(error, f"{self.name}: abort_transaction") from exc
                    log.warning("%s: abort_transaction: %s; resuming it", self.name, error.str())
                except Exception as exc:  # a lost error (SystemError): what it did is unknown
                    failed = KafkaError(KafkaError._FAIL, repr(exc))
                    raise producer_failed(failed, f"{self.name}: abort_transaction") from exc
                except BaseException:
                    raise
                except:  # noqa: E722 - a bare KafkaError (kafka.client_errors)
                    bare = raised_as_exception()
                    failed = error_of(bare) or KafkaError(KafkaError._FAIL, repr(bare))
                    raise producer_failed(failed, f"{self.name}: abort_transaction") from bare
        finally:
            self.open = False

    def _commit_retrying(self) -> None:
        producer = self.producer
        deadline = self._clock.monotonic() + COMMIT_RETRY_S
        for attempt in range(COMMIT_ATTEMPTS):
            if attempt:
                self._stopping.wait(COMMIT_RETRY_PAUSE_S)
            try:
                producer.commit_transaction(TXN_TIMEOUT_S)
                return
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if not (
                    isinstance(error, KafkaError)
                    and error.retriable()
                    and not error.txn_requires_abort()
                    and not error.fatal()
                ):
                    raise
                if self._clock.monotonic() >= deadline or attempt + 1 == COMMIT_ATTEMPTS:
                    raise ForwarderFatalError(
                        f"{self.name}: commit_transaction kept failing "
                        f"({error.str()}); its outcome is unknown"
                    ) from exc
                log.info("%s: commit_transaction: %s; retrying", self.name, error.str())

    def _send_offsets(self, offsets: dict[TP, int]) -> None:
        metadata = self._group_metadata()
        if metadata is None:
            raise KafkaException(KafkaError(KafkaError._STATE, "no group metadata yet"))
        tps = [TopicPartition(topic, p, o) for (topic, p), o in offsets.items()]
        producer = self.producer
        self._guarded(
            "send_offsets_to_transaction",
            lambda: producer.send_offsets_to_transaction(tps, metadata, SEND_OFFSETS_TIMEOUT_S),
            SEND_OFFSETS_TIMEOUT_S,
            slack=SEND_OFFSETS_TIMEOUT_S,
        )

    def _guarded(
        self, what: str, call: Callable[[], Any], timeout: float, slack: float = GUARD_SLACK_S
    ) -> Any:
        """Run a transaction call that can block past its own timeout (librdkafka #5456,
        a group coordinator that is down): a stuck one means the producer cannot be
        trusted any more, which only a restart repairs."""
        outcome: list[Any] = []

        def run() -> None:
            try:
                outcome.append((True, call()))
            except BaseException as exc:  # handed to the caller's thread
                outcome.append((False, exc))
            except:  # noqa: E722 - a bare KafkaError (kafka.client_errors)
                outcome.append((False, raised_as_exception()))

        helper = threading.Thread(target=run, name=f"{what}-{self.name}", daemon=True)
        helper.start()
        helper.join(timeout + slack)
        if not outcome:
            raise ForwarderFatalError(
                f"{self.name}: {what} did not return in {timeout + slack:.0f}s"
            )
        ok, value = outcome[0]
        if not ok:
            raise value
        return value
