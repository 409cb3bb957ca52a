"""Waiting for the daemon's reply to one cancel or reschedule marker.

The sender notes where the outcomes topic ends before it sends (`ReplyWatch`), then
reads from there until a reply keyed by where its marker landed arrives: the daemon
answers once the outcome is durable on its disk (`precise.marker_replies`).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from delayservice.errors import DelayServiceError
from delayservice.precise.marker_replies import MarkerReply, parse_reply, reply_key

BATCH: Final = 500
POLL_S: Final = 0.5


def _ends(consumer: Consumer, topic: str, timeout: float) -> tuple[list[int], dict[int, int]]:
    """The topic's partitions and where each ends now."""
    try:
        info = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if info is None or info.error is not None:
            raise DelayServiceError(
                f"the outcomes topic {topic} is not available; create it with "
                "`delayservice topics create` (precise = true)",
                code=info.error.code() if info is not None and info.error else None,
            )
        partitions = sorted(info.partitions)
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1]
            for p in partitions
        }
    except KafkaException as exc:
        raise DelayServiceError.from_kafka(exc.args[0], f"reading {topic}") from exc
    return partitions, ends


class ReplyWatch:
    """Opened before the marker is sent, so no reply can come before the point read
    from. `wait` then returns the first reply to the marker, or None by `timeout`."""

    def __init__(self, client: dict[str, Any], outcomes_topic: str, timeout: float = 15.0) -> None:
        self._topic = outcomes_topic
        self._consumer = Consumer(
            {
                **client,
                "group.id": f"delayservice-reply-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
            }
        )
        try:
            self._partitions, self._start = _ends(self._consumer, outcomes_topic, timeout)
        except BaseException:
            self._consumer.close()
            raise

    def wait(
        self, marker_topic: str, partition: int, offset: int, timeout: float
    ) -> MarkerReply | None:
        key = reply_key(marker_topic, partition, offset)
        self._consumer.assign(
            [TopicPartition(self._topic, p, self._start[p]) for p in self._partitions]
        )
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            for message in self._consumer.consume(BATCH, min(POLL_S, left)):
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF and error.fatal():
                        raise DelayServiceError.from_kafka(error, f"reading {self._topic}")
                    continue
                if message.key() == key:
                    reply = parse_reply(message.value())
                    if reply is not None:
                        return reply
        return None

    def close(self) -> None:
        self._consumer.close()
