"""Waiting for the daemon's reply to one cancel or reschedule marker.

The daemon answers once the outcome is durable on its disk (`markers.replies`),
with a reply keyed by where the marker landed. Two ways to find it: `ReplyWatch` notes
where the outcomes topic ends before the marker is sent and reads from there (the
CLI's way when it knows it will wait); `wait_for_reply` starts from the marker's append
time, less the replying host's possible clock lag (`REPLY_SKEW_MS`), so an application
may ask long after it sent the marker (the SDK's `MarkerReceipt.reply`).
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable
from typing import Any, Final, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from delayservice.errors import (
    BrokerUnavailableError,
    DelayServiceError,
    RepliesUnavailableError,
)
from delayservice.kafka.client_errors import error_of, raised_by
from delayservice.markers.replies import MarkerReply, parse_reply, reply_key
from delayservice.markers.topic_partitions import metadata_failure, servers_of

__all__ = ["RepliesUnavailableError", "ReplyWatch", "unavailable", "wait_for_reply"]

_T = TypeVar("_T")

BATCH: Final = 500
POLL_S: Final = 0.5


def unavailable(topic: str, code: int | None = None) -> RepliesUnavailableError:
    """The broker answered that the outcomes topic does not exist (only then)."""
    return RepliesUnavailableError(
        f"the broker answered that the outcomes topic {topic} does not exist; create it "
        "with `delayservice topics create` (with precise = true for precise mode's)",
        code=code,
    )


def _partitions(consumer: Consumer, topic: str, timeout: float, servers: str) -> list[int]:
    try:
        info = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
    except KafkaException as exc:
        raise metadata_failure(exc.args[0], servers, topic, timeout) from exc
    error = info.error if info is not None else None
    if info is None or (error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
        raise unavailable(topic, error.code() if error is not None else None)
    if error is not None:
        raise DelayServiceError.from_kafka(error, f"reading {topic}")
    return sorted(info.partitions)


def _ends(consumer: Consumer, topic: str, timeout: float, servers: str) -> dict[int, int]:
    """Where each partition of the topic ends now."""
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1]
            for p in _partitions(consumer, topic, timeout, servers)
        }
    except KafkaException as exc:
        raise DelayServiceError.from_kafka(exc.args[0], f"reading {topic}") from exc


def _since(
    consumer: Consumer, topic: str, since_ms: int, timeout: float, servers: str
) -> dict[int, int]:
    """Where each partition of the topic has its first record at or after `since_ms`
    (its end when it has none)."""
    ends = _ends(consumer, topic, timeout, servers)
    asked = [TopicPartition(topic, p, max(0, since_ms)) for p in ends]
    try:
        found = consumer.offsets_for_times(asked, timeout=timeout)
    except KafkaException as exc:
        raise DelayServiceError.from_kafka(exc.args[0], f"reading {topic}") from exc
    return {tp.partition: tp.offset if tp.offset >= 0 else ends[tp.partition] for tp in found}


def _consumer(client: dict[str, Any]) -> Consumer:
    return Consumer(
        {
            **client,
            "group.id": f"delayservice-reply-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            # Exactly-once, replies commit in the forwarder's transactions: one that
            # was aborted was never given.
            "isolation.level": "read_committed",
        }
    )


def _reading(topic: str, call: Callable[[], _T]) -> _T:
    """A client call of the wait: what the client raises reaches the application as
    the SDK's own error (`DelayServiceError`, with the Kafka code and whether it is
    retriable), as every other failure of `MarkerReceipt.reply` does; a bare
    `KafkaError` too (`kafka.client_errors`)."""
    returned: list[_T] = []
    raised = raised_by(lambda: returned.append(call()))
    if raised is None:
        return returned[0]
    error = error_of(raised)
    if error is None:
        raise raised
    raise DelayServiceError.from_kafka(error, f"reading {topic}") from raised


def _first_reply(
    consumer: Consumer, topic: str, starts: dict[int, int], key: bytes, timeout: float
) -> MarkerReply | None:
    """The first reply with `key` on `topic` from `starts`, or None by `timeout`."""
    assigned = [TopicPartition(topic, p, offset) for p, offset in starts.items()]
    _reading(topic, lambda: consumer.assign(assigned))
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        batch = functools.partial(consumer.consume, BATCH, min(POLL_S, left))
        for message in _reading(topic, batch):
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF and error.fatal():
                    raise DelayServiceError.from_kafka(error, f"reading {topic}")
                continue
            if message.key() == key:
                reply = parse_reply(message.value())
                if reply is not None:
                    return reply
    return None


def wait_for_reply(
    client: dict[str, Any],
    outcomes_topic: str,
    marker: tuple[str, int, int],
    since_ms: int,
    timeout: float,
) -> MarkerReply | None:
    """The first reply to the marker that landed at `marker` (topic, partition,
    offset), read from `since_ms` on; None by `timeout`."""
    deadline = time.monotonic() + timeout
    consumer = _consumer(client)
    try:
        while True:
            try:
                starts = _since(
                    consumer, outcomes_topic, since_ms, max(1.0, timeout), servers_of(client)
                )
                break
            except (RepliesUnavailableError, BrokerUnavailableError):
                raise
            except DelayServiceError:
                # A topic just created has no leader for a moment (NOT_LEADER_FOR_PARTITION,
                # which librdkafka does not mark retriable here): ask again while time is left.
                if time.monotonic() + POLL_S >= deadline:
                    raise
                time.sleep(POLL_S)
        left = max(0.0, deadline - time.monotonic())
        return _first_reply(consumer, outcomes_topic, starts, reply_key(*marker), left)
    finally:
        consumer.close()


class ReplyWatch:
    """Opened before the marker is sent, so no reply can come before the point read
    from. `wait` then returns the first reply to the marker, or None by `timeout`."""

    def __init__(self, client: dict[str, Any], outcomes_topic: str, timeout: float = 15.0) -> None:
        self._topic = outcomes_topic
        self._consumer = _consumer(client)
        try:
            self._start = _ends(self._consumer, outcomes_topic, timeout, servers_of(client))
        except:  # a bare KafkaError too (kafka.client_errors)
            self._consumer.close()
            raise

    def wait(
        self, marker_topic: str, partition: int, offset: int, timeout: float
    ) -> MarkerReply | None:
        key = reply_key(marker_topic, partition, offset)
        return _first_reply(self._consumer, self._topic, self._start, key, timeout)

    def close(self) -> None:
        self._consumer.close()
