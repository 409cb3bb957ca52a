"""How many partitions each topic a producer sends delayed messages to has, as it sees
them: the precise topics, the level topics and the markers topic.

An exact send picks its partition from the count (`ids.precise_id`), a level send from
its key over the count (`DelayProducer`), so a count known
is kept (partitions are never removed, so it stays valid) and refreshed at most every
`REFRESH_S`: producers start using partitions added to a topic within that long, and a
failed refresh changes nothing. A marker needs no count at all when its id names its
partition.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Final

from confluent_kafka import KafkaException

from delayservice.errors import DelayServiceError

METADATA_TIMEOUT_S: Final = 10.0
"""How long the first delayed send or marker to a topic waits for its partition count."""
REFRESH_S: Final = 300.0
"""How often sends look for partitions a topic has gained (librdkafka's
`topic.metadata.refresh.interval.ms` default)."""
REFRESH_TIMEOUT_S: Final = 2.0


class TopicPartitions:
    def __init__(self, client: Any) -> None:
        """`client`: anything with confluent-kafka's `list_topics`."""
        self._client = client
        self._counts: dict[str, tuple[int, float]] = {}  # topic -> (count, when read)

    def count(self, topic: str, *, refresh: bool = False) -> int:
        """The topic's partition count: read at the first need (raising a retriable
        `DelayServiceError` that names the topic when it cannot be), then with
        `refresh` again every `REFRESH_S`."""
        known = self._counts.get(topic)
        now = time.monotonic()
        if known is None:
            count = self.read(topic, METADATA_TIMEOUT_S)
        elif refresh and now - known[1] >= REFRESH_S:
            count = known[0]
            with contextlib.suppress(DelayServiceError):
                count = max(count, self.read(topic, REFRESH_TIMEOUT_S))
        else:
            return known[0]
        self._counts[topic] = (count, now)
        return count

    def exists(self, topic: str) -> bool:
        """Whether the topic can be written now (its count is known or readable)."""
        try:
            self.count(topic)
        except DelayServiceError:
            return False
        return True

    def read(self, topic: str, timeout: float) -> int:
        try:
            meta = self._client.list_topics(topic, timeout=timeout)
        except KafkaException as exc:
            error = exc.args[0]
            raise DelayServiceError(
                f"cannot read the partitions of {topic}: {error.str()}",
                code=error.code(),
                retriable=True,
            ) from exc
        info = meta.topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            problem = info.error.str() if info is not None and info.error else "no partitions"
            raise DelayServiceError(
                f"the topic {topic} is not available ({problem}); create it with "
                "`delayservice topics create` (with precise = true for precise mode's)",
                code=info.error.code() if info is not None and info.error else None,
                retriable=True,
            )
        return len(info.partitions)
