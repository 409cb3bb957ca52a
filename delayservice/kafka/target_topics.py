"""Partition counts of real topics, cached, so an unknown target is caught at once.

Without this, librdkafka holds a record for an unknown topic until its metadata
propagation timeout (30 s by default) before failing it. A topic that does not exist
is re-checked after a short negative TTL so a topic created a moment later is found.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from delayservice.errors import DelayServiceError


class TargetTopics:
    def __init__(
        self, client: Any, ttl_s: float = 30.0, negative_ttl_s: float = 2.0, timeout_s: float = 5.0
    ) -> None:
        self._client = client
        self._ttl = ttl_s
        self._negative_ttl = negative_ttl_s
        self._timeout = timeout_s
        self._cache: dict[str, tuple[int | KafkaError, float]] = {}

    def partitions(self, topic: str) -> int | KafkaError:
        """Partition count, or the broker's error when the topic does not exist or is
        not authorized (a permanent answer for this record).

        Raises a retriable `DelayServiceError` when the broker cannot be asked.
        """
        now = time.monotonic()
        cached = self._cache.get(topic)
        if cached is not None and cached[1] > now:
            return cached[0]
        try:
            meta = self._client.list_topics(topic=topic, timeout=self._timeout)
        except KafkaException as exc:
            raise DelayServiceError.from_kafka(exc.args[0], f"metadata for {topic}") from exc
        info = meta.topics.get(topic)
        if info is None:
            absent = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
            self._cache[topic] = (absent, now + self._negative_ttl)
            return absent
        if info.error is not None and info.error.code() in _ABSENT:
            self._cache[topic] = (info.error, now + self._negative_ttl)
            return info.error  # type: ignore[no-any-return]
        if info.error is not None:
            raise DelayServiceError.from_kafka(info.error, f"metadata for {topic}")
        count = len(info.partitions)
        self._cache[topic] = (count, now + self._ttl)
        return count


_ABSENT = {
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
}
