"""Delayed sends waiting for their topic's partition count, so that `produce()` never
waits for the broker.

A delayed record's partition, and so its id, is chosen when `produce()` is called. While
the topic's count is not known yet (the producer was just made, or no broker answers),
it is chosen over the count `topics create` gives (`settings.partitions`), and the
record waits here, in the order sent, until the count is read (`TopicPartitions`). Then
it goes to librdkafka, or, when that partition does not exist or the topic does not,
fails through its delivery callback, as librdkafka fails what it cannot route. A record
that waits longer than the producer's `message.timeout.ms` fails the same way
(`_MSG_TIMED_OUT`). Later sends to a topic with records waiting wait behind them, so a
key's records keep their order. Failures reach their callbacks from `serve()`, which the
producer's `poll()` and `flush()` call, never from `produce()`.

A record's placement on the real topic does not depend on any of this: the envelope
carries the application's partitioner, or its explicit partition, and the daemon places
the forward by it (invariant 5).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from confluent_kafka import KafkaError, Message

from delayservice.errors import DelayServiceError
from delayservice.precise.topic_partitions import TopicMissingError

DEFAULT_TIMEOUT_MS: Final = 300_000
"""librdkafka's `message.timeout.ms` default."""


def timeout_s(config: dict[str, Any]) -> float:
    """How long a record may wait unsent: the producer's `message.timeout.ms` (or
    `delivery.timeout.ms`), 0 meaning for ever, as librdkafka reads them."""
    raw = config.get("message.timeout.ms", config.get("delivery.timeout.ms", DEFAULT_TIMEOUT_MS))
    millis = int(raw)
    return float("inf") if millis == 0 else millis / 1000


@dataclass
class Held:
    topic: str
    partition: int
    value: Any
    key: Any
    headers: Any
    kwargs: dict[str, Any]
    since: float = field(default_factory=time.monotonic)

    def failed(self, error: KafkaError) -> tuple[Callable[[Any, Any], None], Any, Any] | None:
        callback = self.kwargs.get("on_delivery")
        if callback is None:
            return None
        message = Message(
            topic=self.topic,
            partition=self.partition,
            value=self.value,
            key=self.key,
            headers=self.headers,
            error=error,
        )
        return callback, error, message


class HeldSends:
    def __init__(self, produce: Callable[..., None], timeout: float) -> None:
        """`produce`: librdkafka's; `timeout`: seconds a record may wait unsent."""
        self._produce = produce
        self._timeout = timeout
        self._lock = threading.Condition()
        self._held: dict[str, deque[Held]] = {}
        self._failed: deque[tuple[Callable[[Any, Any], None], Any, Any]] = deque()
        self._why: dict[str, str] = {}  # topic -> why its count could not be read

    def send(self, record: Held, *, routable: bool) -> None:
        """Hand the record to librdkafka now if its topic's count is known and nothing
        waits before it; else keep it until `release`."""
        with self._lock:
            if routable and record.topic not in self._held:
                self._send(record, full_raises=True)  # BufferError, as librdkafka's
            else:
                self._held.setdefault(record.topic, deque()).append(record)

    def waits_for(self, topic: str) -> bool:
        """Whether records still wait for the topic's count (after failing those that
        waited too long)."""
        self.expire()
        return topic in self._held

    def release(self, topic: str, count: int | None, error: DelayServiceError | None) -> None:
        """The topic's count was read (`count`), or could not be (`error`): send what
        waits for it, or fail it when the broker said the topic does not exist."""
        with self._lock:
            if error is not None:
                self._why[topic] = str(error)
            waiting = self._held.get(topic)
            if waiting is None:
                return
            while waiting and count is not None:
                record = waiting[0]
                if record.partition >= count:
                    self._fail(
                        record,
                        KafkaError(
                            KafkaError._UNKNOWN_PARTITION,
                            f"{topic} has {count} partitions, not partition {record.partition}",
                        ),
                    )
                elif not self._send(record):
                    break
                waiting.popleft()
            if isinstance(error, TopicMissingError) or (error is not None and not error.retriable):
                while waiting:
                    self._fail(waiting.popleft(), _error(error))
            if not waiting:
                del self._held[topic]
            self._lock.notify_all()

    def expire(self) -> None:
        """Fail what has waited longer than the timeout."""
        now = time.monotonic()
        with self._lock:
            for topic, waiting in list(self._held.items()):
                while waiting and now - waiting[0].since >= self._timeout:
                    self._fail(
                        waiting.popleft(),
                        KafkaError(
                            KafkaError._MSG_TIMED_OUT,
                            f"not sent within message.timeout.ms: the partition count of "
                            f"{topic} is not known ({self._why.get(topic, 'not read yet')})",
                        ),
                    )
                if not waiting:
                    del self._held[topic]
            self._lock.notify_all()

    def purge(self) -> None:
        """Fail everything waiting (the producer is closing)."""
        with self._lock:
            for waiting in self._held.values():
                for record in waiting:
                    self._fail(record, KafkaError(KafkaError._PURGE_QUEUE))
            self._held.clear()
            self._lock.notify_all()

    def serve(self) -> int:
        """Call the callbacks of the records that failed; how many there were."""
        served = 0
        while self._failed:
            callback, error, message = self._failed.popleft()
            callback(error, message)
            served += 1
        return served

    def wait(self, timeout: float) -> None:
        """Until nothing waits, or `timeout` seconds (expiring as it goes)."""
        deadline = time.monotonic() + timeout
        while True:
            self.expire()
            left = deadline - time.monotonic()
            with self._lock:
                if not self._held or left <= 0:
                    return
                self._lock.wait(min(left, 0.1))

    def __len__(self) -> int:
        with self._lock:
            return sum(len(waiting) for waiting in self._held.values())

    def _send(self, record: Held, *, full_raises: bool = False) -> bool:
        try:
            self._produce(
                record.topic, record.value, record.key, headers=record.headers,
                partition=record.partition, **record.kwargs,
            )  # fmt: skip
        except BufferError:
            if full_raises:
                raise
            return False  # librdkafka's queue is full: sent at the next release
        return True

    def _fail(self, record: Held, error: KafkaError) -> None:
        failure = record.failed(error)
        if failure is not None:
            self._failed.append(failure)


def _error(error: DelayServiceError) -> KafkaError:
    return KafkaError(
        error.code if error.code is not None else KafkaError.UNKNOWN_TOPIC_OR_PART,
        str(error),
        retriable=error.retriable,
    )
