"""Read topic partitions over a time window and keep the records a test accepts.

`delayservice find` has no index to consult: Kafka finds records by offset or time,
not by header. So a lookup reads every record of the window once, from the offset
`offsets_for_times` gives for its start to the end offset each partition had when the
scan began, and only looks at headers (never values) to decide.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from delayservice.errors import DelayServiceError
from delayservice.kafka.record_headers import readable_headers

TIMEOUT_S = 15.0
BATCH = 5_000
STALL_S = 30.0
"""A scan that reads nothing for this long while records remain gives up, naming them."""

Headers = list[tuple[str, Any]]


@dataclass(frozen=True)
class Hit:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    headers: dict[str, bytes]


def header_text(headers: Headers, name: str) -> str | None:
    """The last value of `name` as text (None: absent, null or not UTF-8)."""
    found = None
    for key, value in headers:
        if key == name:
            found = value
    if isinstance(found, bytes):
        try:
            return found.decode()
        except UnicodeDecodeError:
            return None
    return found if isinstance(found, str) else None


class TopicScan:
    """One consumer for a whole lookup; `scan` may be called for several topics."""

    def __init__(self, client: dict[str, Any]) -> None:
        self._consumer = Consumer(
            {
                **client,
                "group.id": f"delayservice-find-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
            }
        )
        self.records_read = 0

    def close(self) -> None:
        self._consumer.close()

    def partitions(self, topic: str) -> list[int] | None:
        """The topic's partitions, None when it does not exist."""
        meta = self._consumer.list_topics(topic, timeout=TIMEOUT_S).topics.get(topic)
        if meta is None or meta.error is not None:
            return None
        return sorted(meta.partitions)

    def planned(
        self, topic: str, partitions: list[int], since_ms: int
    ) -> dict[int, tuple[int, int]]:
        """Per partition, the offsets [start, end) the window covers."""
        asked = [TopicPartition(topic, p, since_ms) for p in partitions]
        plan: dict[int, tuple[int, int]] = {}
        try:
            starts = self._consumer.offsets_for_times(asked, timeout=TIMEOUT_S)
            for tp in starts:
                _, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, tp.partition), timeout=TIMEOUT_S, cached=False
                )
                start = tp.offset if tp.offset >= 0 else high  # -1: nothing that recent
                if start < high:
                    plan[tp.partition] = (start, high)
        except KafkaException as exc:
            raise DelayServiceError(f"planning a scan of {topic}: {exc}") from exc
        return plan

    def scan(
        self,
        topic: str,
        plan: dict[int, tuple[int, int]],
        keep: Callable[[Headers], bool],
        on_read: Callable[[int], None] | None = None,
    ) -> list[Hit]:
        """Every record of `plan` whose headers `keep` accepts, in read order."""
        hits: list[Hit] = []

        def look(record: Any) -> None:
            headers = readable_headers(record)
            if headers and keep(headers):
                hits.append(_hit(topic, record, headers))

        self._read(topic, plan, look, on_read)
        return hits

    def scan_keys(
        self,
        topic: str,
        plan: dict[int, tuple[int, int]],
        keys: Container[bytes],
        on_read: Callable[[int], None] | None = None,
    ) -> list[tuple[bytes, bytes | None]]:
        """(key, value) of every record of `plan` whose key is one of `keys`, in read
        order. Headers are never read: a topic keyed by what it answers needs none."""
        found: list[tuple[bytes, bytes | None]] = []

        def look(record: Any) -> None:
            key = record.key()
            if isinstance(key, bytes) and key in keys:
                found.append((key, record.value()))

        self._read(topic, plan, look, on_read)
        return found

    def _read(
        self,
        topic: str,
        plan: dict[int, tuple[int, int]],
        look: Callable[[Any], None],
        on_read: Callable[[int], None] | None,
    ) -> None:
        """Hand every record of `plan` to `look`, once, in read order."""
        if not plan:
            return
        consumer = self._consumer
        consumer.assign([TopicPartition(topic, p, start) for p, (start, _) in plan.items()])
        ends = {p: end for p, (_, end) in plan.items()}
        last_read = time.monotonic()
        try:
            while ends:
                batch = consumer.consume(BATCH, 0.5)
                if not batch and time.monotonic() - last_read > STALL_S:
                    left = ", ".join(f"{topic}[{p}]" for p in sorted(ends))
                    raise DelayServiceError(f"reading {left} stalled for {STALL_S:.0f} s")
                read = 0
                for record in batch:
                    partition = record.partition() or 0
                    end = ends.get(partition)
                    if end is None:
                        continue
                    error = record.error()
                    offset = record.offset() or 0
                    if error is not None and error.code() != KafkaError._PARTITION_EOF:
                        raise DelayServiceError(f"reading {topic}[{partition}]: {error.str()}")
                    if error is None:
                        read += 1
                        look(record)
                    if error is not None or offset + 1 >= end:
                        del ends[partition]  # the end of its window (or of the partition)
                if batch:
                    last_read = time.monotonic()
                self.records_read += read
                if on_read is not None and read:
                    on_read(read)
        finally:
            consumer.unassign()


def _hit(topic: str, record: Any, headers: Headers) -> Hit:
    return Hit(
        topic,
        record.partition() or 0,
        record.offset() or 0,
        record.timestamp()[1],
        {k: v if isinstance(v, bytes) else str(v).encode() for k, v in headers if v is not None},
    )
