"""Delayed records waiting for their topic's partition count, so that `produce()` never
waits for the broker.

A delayed record's partition, and so its id, is chosen when `produce()` is called. While
the topic's count is not known yet (the producer was just made, or no broker answers),
it is chosen over the count `topics create` gives (`settings.partitions`), and the
record waits here, in the order sent. Whoever next finds the count known sends what
waits for the topic in bulk, in order, before anything later of that topic: the next
`produce()` to it, `poll()`, `flush()`, or the thread that read the count. A send that
finds the count unknown looks again under the lock before it waits, so a count read in
between is never missed (the first version lost that wake-up and held records until
they timed out).

What waits fails through its delivery callback, at the next `poll()` or `flush()`, as
librdkafka fails what it cannot route: the broker answered that the topic does not
exist, the partition chosen does not exist, or `message.timeout.ms` passed. At most
`queue.buffering.max.messages` records wait; beyond that, and while librdkafka's queue
is too full to take what waits, `produce()` raises `BufferError`, as librdkafka's does.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from confluent_kafka import KafkaError, Message

from delayservice.errors import DelayServiceError
from delayservice.markers.topic_partitions import TopicMissingError

DEFAULT_TIMEOUT_MS: Final = 300_000
"""librdkafka's `message.timeout.ms` default."""
DEFAULT_LIMIT: Final = 100_000
"""librdkafka's `queue.buffering.max.messages` default."""

Failure = tuple[Callable[[Any, Any], None], KafkaError, Message]


def timeout_s(config: dict[str, Any]) -> float:
    """How long a record may wait unsent: the producer's `message.timeout.ms` (or
    `delivery.timeout.ms`), 0 meaning for ever, as librdkafka reads them."""
    raw = config.get("message.timeout.ms", config.get("delivery.timeout.ms", DEFAULT_TIMEOUT_MS))
    millis = int(raw)
    return float("inf") if millis == 0 else millis / 1000


class Held(NamedTuple):
    topic: str
    partition: int
    value: Any
    key: Any
    headers: Any
    kwargs: dict[str, Any]
    since: float


class HeldSends:
    def __init__(
        self,
        produce: Callable[..., None],
        known: Callable[[str], int | None],
        config: dict[str, Any],
        failures: dict[str, DelayServiceError] | None = None,
    ) -> None:
        """`produce`: librdkafka's; `known`: a topic's count known now (never waits:
        one not known is read ahead, at most every `RETRY_S` after a failed read, so
        whatever looks for it, `flush()` too, keeps it asked); `config`: the
        producer's (its timeout, queue size and callback);
        `failures`: why the last read of a count not known failed, by topic."""
        self._produce = produce
        self._known = known
        self._failures = {} if failures is None else failures
        self._timeout = timeout_s(config)
        self._limit = int(config.get("queue.buffering.max.messages", DEFAULT_LIMIT))
        self._default_callback = config.get("on_delivery")
        self._lock = threading.Condition(threading.RLock())
        self.topics: dict[str, deque[Held]] = {}
        """Topic -> what waits for its count, in the order sent (read without the lock:
        empty, the producer sends straight to librdkafka)."""
        self._size = 0
        self._failed: deque[Failure] = deque()

    def send(self, record: Held, count: int | None) -> None:
        """Send `record` after what waits for its topic, or keep it behind them while
        the count is not known. `BufferError` when librdkafka's queue (or this one) is
        full: nothing of `record` is kept, as librdkafka's `produce()`."""
        with self._lock:
            if count is None:
                count = self._known(record.topic)  # read since the caller looked
            if count is not None:
                if not self._drain(record.topic, count):
                    raise BufferError("Local: Queue full (records wait for their turn)")
                if record.partition >= count:  # placed before the count came
                    self._fail(record, _unknown_partition(record, count))
                    return
                self._produce(
                    record.topic, record.value, record.key, headers=record.headers,
                    partition=record.partition, **record.kwargs,
                )  # fmt: skip
                return
            refused = _refusal(self._failures.get(record.topic))
            if refused is not None:
                self._fail(record, refused)  # until a read finds the topic
                return
            if self._size >= self._limit:
                raise BufferError(
                    f"Local: Queue full ({self._size} records wait for the partition "
                    f"count of {', '.join(self.topics)})"
                )
            self.topics.setdefault(record.topic, deque()).append(record)
            self._size += 1

    def send_after(self, record: Held) -> None:
        """Send `record`, whose partition needs no count (a marker naming its message's),
        after what waits for its topic: it never overtakes a record it may name."""
        with self._lock:
            waiting = self.topics.get(record.topic)
            if waiting is not None:
                waiting.append(record)
                self._size += 1
                return
            self._produce(
                record.topic, record.value, record.key, headers=record.headers,
                partition=record.partition, **record.kwargs,
            )  # fmt: skip

    def waits_for(self, topic: str) -> bool:
        return topic in self.topics

    def release(self, topic: str, count: int | None, error: DelayServiceError | None) -> None:
        """The topic's count was read (`count`), or could not be (`error`): send what
        waits for it, or fail it when the broker answered that the topic does not
        exist. An outage fails nothing: it waits for `message.timeout.ms`."""
        with self._lock:
            self._expire(time.monotonic())
            if topic not in self.topics:
                return
            failure = _refusal(error)
            if count is not None:
                self._drain(topic, count)
            elif failure is not None:
                for record in self.topics.pop(topic):
                    self._fail(record, failure)
                    self._size -= 1
            self._lock.notify_all()

    def serve(self) -> int:
        """Send what waits for a count known now, fail what waited too long, then call
        the callbacks of the records that failed (outside the lock); how many."""
        if self.topics:
            with self._lock:
                self._expire(time.monotonic())
                for topic in list(self.topics):
                    count = self._known(topic)
                    if count is not None:
                        self._drain(topic, count)
                self._lock.notify_all()
        served = 0
        while self._failed:
            callback, error, message = self._failed.popleft()
            callback(error, message)
            served += 1
        return served

    @property
    def busy(self) -> bool:
        return bool(self.topics or self._failed)

    def wait(self, timeout: float) -> None:
        """Until a count is read or `timeout` seconds pass."""
        with self._lock:
            if self.topics:
                self._lock.wait(timeout)

    def purge(self) -> None:
        """Fail everything waiting (the producer is closing), as librdkafka's purge."""
        with self._lock:
            for waiting in self.topics.values():
                for record in waiting:
                    self._fail(record, KafkaError(KafkaError._PURGE_QUEUE))
            self.topics.clear()
            self._size = 0
            self._lock.notify_all()

    def __len__(self) -> int:
        return self._size

    def _drain(self, topic: str, count: int) -> bool:
        """Send what waits for `topic`, in order, until librdkafka's queue is full;
        whether nothing is left. Under the lock."""
        waiting = self.topics.get(topic)
        if waiting is None:
            return True
        produce = self._produce
        while waiting:
            record = waiting[0]
            if record.partition >= count:
                self._fail(record, _unknown_partition(record, count))
            else:
                try:
                    produce(
                        topic, record.value, record.key, headers=record.headers,
                        partition=record.partition, **record.kwargs,
                    )  # fmt: skip
                except BufferError:
                    return False  # sent by the next produce(), poll() or flush()
                except (
                    Exception
                ) as exc:  # refused as librdkafka refuses a record: its callback says so
                    self._fail(record, _kafka_error(exc))
            waiting.popleft()
            self._size -= 1
        del self.topics[topic]
        return True

    def _expire(self, now: float) -> None:
        for topic, waiting in list(self.topics.items()):
            while waiting and now - waiting[0].since >= self._timeout:
                why = self._failures.get(topic)
                self._fail(
                    waiting.popleft(),
                    KafkaError(
                        KafkaError._MSG_TIMED_OUT,
                        f"not sent within message.timeout.ms: the partition count of {topic} "
                        f"could not be read{f' ({why})' if why is not None else ''}",
                    ),
                )
                self._size -= 1
            if not waiting:
                del self.topics[topic]

    def _fail(self, record: Held, error: KafkaError) -> None:
        callback = record.kwargs.get("on_delivery") or self._default_callback
        if callback is not None:
            message = Message(
                topic=record.topic,
                partition=record.partition,
                value=record.value,
                key=record.key,
                headers=record.headers,
                error=error,
            )
            self._failed.append((callback, error, message))


def _refusal(error: DelayServiceError | None) -> KafkaError | None:
    """What fails a record waiting for a count that could not be read: the broker
    answered that the topic does not exist, or anything not retriable; None for an
    outage, which fails nothing before `message.timeout.ms`."""
    if error is None or not (isinstance(error, TopicMissingError) or not error.retriable):
        return None
    code = error.code if error.code is not None else KafkaError._UNKNOWN_TOPIC
    return KafkaError(code, str(error), retriable=error.retriable)


def _unknown_partition(record: Held, count: int) -> KafkaError:
    return KafkaError(
        KafkaError._UNKNOWN_PARTITION,
        f"{record.topic} has {count} partitions, not partition {record.partition} "
        "(chosen before its count was known)",
    )


def _kafka_error(exc: Exception) -> KafkaError:
    first = exc.args[0] if exc.args else None
    if isinstance(first, KafkaError):
        return first
    return KafkaError(KafkaError._INVALID_ARG, str(exc))
