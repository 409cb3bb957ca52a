"""Partition counts of real topics, cached, so an unknown target is caught at once.

Without this, librdkafka holds a record for an unknown topic until its metadata
propagation timeout (30 s by default) before failing it. A topic that does not exist
is re-checked after a short negative TTL so a topic created a moment later is found.
When the broker cannot be asked at all (metadata times out after seconds), every name
is answered "not now" for a short while without asking, so a pass over many targets
waits once, not once per target and twice per record.
The cache is bounded (the oldest entries go first), because target names come
from records, and records can name anything.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from delayservice.errors import DelayServiceError

MAX_ENTRIES = 10_000


class TargetTopics:
    """Thread-safe: one instance serves every level of a process."""

    def __init__(
        self,
        client: Any,
        ttl_s: float = 30.0,
        negative_ttl_s: float = 2.0,
        timeout_s: float = 5.0,
        max_entries: int = MAX_ENTRIES,
        unreachable_hold_s: float = 1.0,
        clock: Any = time,
    ) -> None:
        """`clock`: anything with `monotonic()` (the `time` module, a test's clock)."""
        self._client = client
        self._ttl = ttl_s
        self._negative_ttl = negative_ttl_s
        self._timeout = timeout_s
        self._max_entries = max_entries
        self._unreachable_hold = unreachable_hold_s
        self._clock = clock
        self._unreachable: tuple[Any, float] | None = None
        """The client's last error asking the broker, and until when (monotonic s) it
        stands for every name."""
        self._cache: OrderedDict[str, tuple[int | KafkaError, float]] = OrderedDict()
        self._lock = threading.Lock()  # shared by every level's threads; never held over I/O

    def __len__(self) -> int:
        return len(self._cache)

    def forget(self, topic: str) -> None:
        """Drop a cached answer the broker has just contradicted."""
        with self._lock:
            self._cache.pop(topic, None)

    def partitions(self, topic: str, *, fresh: bool = False) -> int | KafkaError:
        """Partition count, or the broker's error when the topic does not exist, is not
        valid or is not authorized (a permanent answer for this record).

        Raises a retriable `DelayServiceError` when the broker cannot be asked.
        """
        now = self._clock.monotonic()
        if not fresh:
            # The hit path takes no lock and does not reorder: one atomic read per record.
            # Eviction is therefore by age of insertion, which only costs a re-fetch.
            cached = self._cache.get(topic)
            if cached is not None and cached[1] > now:
                return cached[0]
        unreachable = self._unreachable
        if unreachable is not None and unreachable[1] > now:
            raise DelayServiceError.from_kafka(unreachable[0], f"metadata for {topic}")
        try:
            meta = self._client.list_topics(topic=topic, timeout=self._timeout)
        except KafkaException as exc:
            self._unreachable = (exc.args[0], self._clock.monotonic() + self._unreachable_hold)
            raise DelayServiceError.from_kafka(exc.args[0], f"metadata for {topic}") from exc
        except (ValueError, RuntimeError, TypeError) as exc:
            # librdkafka refuses the name itself (embedded NUL, too long): permanent.
            return self._store(topic, KafkaError(KafkaError._INVALID_ARG, str(exc)), now)
        info = meta.topics.get(topic)
        if info is None:
            return self._store(topic, KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), now)
        if info.error is not None and info.error.code() in _PERMANENT:
            return self._store(topic, info.error, now)
        if info.error is not None:
            raise DelayServiceError.from_kafka(info.error, f"metadata for {topic}")
        return self._store(topic, len(info.partitions), now)

    def _store(self, topic: str, answer: int | KafkaError, now: float) -> int | KafkaError:
        ttl = self._ttl if isinstance(answer, int) else self._negative_ttl
        with self._lock:
            self._cache[topic] = (answer, now + ttl)
            self._cache.move_to_end(topic)
            while len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)
        return answer


_PERMANENT = {
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.TOPIC_EXCEPTION,
    KafkaError._INVALID_ARG,
}
