"""One consumer for one thread, kept usable: what the level consumer thread and the
precise intake share about their client's life.

A consumer that hits a fatal error (fenced after a coordinator failover, or any error
librdkafka flags fatal) is unusable; the thread that owns it replaces it with a new one
rather than stopping the daemon, and only when that keeps happening (another live
process with the same instance name) does it give up. Callbacks are bound to the client
they were made for, so a replaced client that still reports while it closes never
touches the state of its successor, and a close that hangs never holds the thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from confluent_kafka import KafkaError, TopicPartition

from delayservice.kafka.client_errors import raised_by
from delayservice.kafka.client_seam import ConsumerClient

log = logging.getLogger(__name__)

REPLACEMENTS_ALLOWED: Final = 5
REPLACEMENT_WINDOW_S: Final = 300.0
CLOSE_WAIT_S: Final = 5.0

MakeConsumer = Callable[[dict[str, Any]], ConsumerClient]
"""Builds a consumer from the callbacks it must report to (error_cb, on_commit...)."""


def unread_records(consumer: ConsumerClient, topic: str, partitions: list[int]) -> int:
    """Records on `partitions` past the consumer's position, from cached watermarks."""
    tps = [TopicPartition(topic, p) for p in partitions]
    if not tps:
        return 0
    total = 0
    for tp in consumer.position(tps):
        low, high = consumer.get_watermark_offsets(tp, cached=True)
        if high < 0:
            continue
        position = tp.offset if tp.offset >= 0 else low
        total += max(0, high - position)
    return total


class ConsumerKeeper:
    def __init__(
        self,
        name: str,
        make: MakeConsumer,
        on_error: Callable[[KafkaError], None],
        on_commit: Callable[[KafkaError | None, list[TopicPartition]], None],
        on_fatal: Callable[[str], None],
        count_replacement: Callable[[], None] = lambda: None,
    ) -> None:
        """Each client reports errors and commits to `on_error` and `on_commit` until it
        is replaced; a replaced one that still reports while it closes must not touch
        the state of its successor. `on_fatal` stops the daemon when replacing does not
        help."""
        self._name = name
        self._make = make
        self._on_error = on_error
        self._on_commit = on_commit
        self._on_fatal = on_fatal
        self._count = count_replacement
        self._generation = 0
        self._replacements: deque[float] = deque()
        self.failed: str | None = None
        """Why the client is unusable, until it is replaced."""
        self.client = self._new()

    def _new(self) -> ConsumerClient:
        self._generation += 1
        return self._make(self._bound_callbacks(self.current_check()))

    def _bound_callbacks(self, current: Callable[[], bool]) -> dict[str, Any]:
        """Neither callback ever raises: served inside consume(), an exception would
        make confluent-kafka drop the batch the call fetched, and leave librdkafka
        unable to destroy the client (docs/faults.md, row 33)."""

        def on_error(error: KafkaError) -> None:
            if current():
                self._report(raised_by(lambda: self._on_error(error)), "an error")

        def on_commit(error: KafkaError | None, partitions: list[TopicPartition]) -> None:
            if current():
                self._report(raised_by(lambda: self._on_commit(error, partitions)), "a commit")

        return {"error_cb": on_error, "on_commit": on_commit}

    def _report(self, failed: Exception | None, what: str) -> None:
        if failed is not None:
            with contextlib.suppress(Exception):  # logging itself may be what fails
                log.error(
                    "%s: handling %s the client reported failed", self._name, what, exc_info=failed
                )

    def current_check(self) -> Callable[[], bool]:
        """A test that stays true while the present client is the kept one: for
        callbacks handed to it later (rebalance callbacks at subscribe)."""
        generation = self._generation
        return lambda: generation == self._generation

    def fail(self, why: str) -> None:
        """The client is unusable; the owning thread replaces it at its next turn."""
        self.failed = why

    def replace(self, hint: str = "") -> bool:
        """Replace a failed client with a new one; False (and the daemon stopping) when
        clients have failed `REPLACEMENTS_ALLOWED` times in `REPLACEMENT_WINDOW_S`.
        `hint` is added to the line that gives up."""
        why = self.failed
        now = time.monotonic()
        while self._replacements and now - self._replacements[0] > REPLACEMENT_WINDOW_S:
            self._replacements.popleft()
        if len(self._replacements) >= REPLACEMENTS_ALLOWED:
            self._on_fatal(
                f"consumer of {self._name} failed {len(self._replacements) + 1} times in "
                f"{REPLACEMENT_WINDOW_S:.0f}s (last: {why}){hint}"
            )
            return False
        self._replacements.append(now)
        self._count()
        log.error("%s: consumer failed (%s); replacing it", self._name, why)
        failed = self.client
        self.failed = None
        self.client = self._new()  # from here on the old one's callbacks are moot
        self._close_soon(failed)
        return True

    def close(self) -> None:
        self._close_soon(self.client)

    def _close_soon(self, consumer: ConsumerClient) -> None:
        """Close, waiting at most `CLOSE_WAIT_S`: a wedged client may block in close."""
        closer = threading.Thread(target=self._close_quietly, args=(consumer,), daemon=True)
        closer.start()
        closer.join(CLOSE_WAIT_S)

    def _close_quietly(self, consumer: ConsumerClient) -> None:
        try:
            consumer.close()
        except Exception as exc:  # a failed client may refuse even this
            log.warning("%s: closing the consumer: %s", self._name, exc)
