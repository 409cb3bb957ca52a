"""Where the markers reader reads each partition to: the clients that list the topics
and ask their ends, apart from the reading consumer (asked of it, each answer waits
behind its fetch, `fetch.wait.max.ms`).

A markers partition is read to its last stable offset, so an application's transaction
left open does not hold the gate (its markers are not acknowledged yet). An outcomes
partition is read to the end of its log, every transaction in it ended and read: a new
owner takes its predecessor's moves as known once the answers are read past the time
it took the partition. A member killed with answers in its open transaction pins the
stable end until the broker aborts it, and answers committed meanwhile sit above it;
and the broker writes a transaction's commit markers after the commit returns,
partition by partition. Read to the stable end, the reader vouched for times without
those answers, and a new owner moved again what was moved. An answer left open by a
member that died holds the end until its transaction times out (only the new owners'
moves and answers wait meanwhile).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from delayservice.level.markers.topics import PASS_TIMEOUT_S, partitions_of


class PartitionEnds:
    def __init__(
        self,
        make_consumer: Callable[[dict[str, Any]], Any],
        config: Callable[[str], dict[str, Any]],
        markers_topic: str,
    ) -> None:
        """`config(role)`: a client's configuration (read_committed)."""
        self._make = make_consumer
        self._config = config
        self._markers_topic = markers_topic
        self.lister: Any = None
        """Never assigned: lists partitions, and asks the markers partitions' ends."""
        self._log_ends: Any = None
        """read_uncommitted: asks the outcomes partitions' ends."""

    def partitions(self, topic: str) -> list[int]:
        """`topic`'s partitions, asked of the client that asks its ends: a partition
        added since is then one that client knows (librdkafka answers a partition
        missing from a client's metadata with `_UNKNOWN_PARTITION`)."""
        return partitions_of(self._client_for(topic), topic)

    def end_of(self, tp: Any) -> int:
        """Where `tp` must be read to for a time noted before asking."""
        client = self._client_for(tp.topic)
        high: int = client.get_watermark_offsets(tp, timeout=PASS_TIMEOUT_S, cached=False)[1]
        return high

    def _client_for(self, topic: str) -> Any:
        if topic == self._markers_topic:
            if self.lister is None:
                self.lister = self._make(self._config("markers-lister"))
            return self.lister
        if self._log_ends is None:
            config = self._config("outcomes-lister")
            self._log_ends = self._make({**config, "isolation.level": "read_uncommitted"})
        return self._log_ends

    def close(self) -> None:
        for client in (self.lister, self._log_ends):
            if client is not None:
                client.close()
