"""A transaction coordinator and a read_committed reader for the fakes of
`tests/level/fakes.py`, so precise mode's exactly-once paths run without a broker.

`FakeCoordinator` keeps what committed transactions wrote, in commit order, as a
read_committed reader sees it. `FencingProducer` is a `FakeProducer` whose
transactional id it registers: like the broker and librdkafka, `init_transactions` of a
newer producer with the same id fences the older one, whose next transactional call
or produce then fails with the fatal `_FENCED` error (`FakeProducer.go_fatal`), and
ends the older one's open transaction first: a commit already under way completes
(the coordinator has it) when `in_flight_completes`, else it is aborted, as when its
EndTxn never reached the coordinator. `purge` of a producer given up leaves that
decision to the next init, as the real client does. `DoneReader` reads one topic
from the coordinator's committed records, as a read_committed consumer assigned to its
only partition would.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import KafkaError, Message, TopicPartition

from tests.level.fakes import FakeClock, FakeProducer, Sent


class FakeCoordinator:
    def __init__(self) -> None:
        self.committed: list[Sent] = []
        """What committed transactions (and non-transactional producers) wrote, in order."""
        self.holders: dict[str, FencingProducer] = {}
        self.in_flight_completes = True
        self.inits = 0

    def take_over(self, producer: FencingProducer) -> None:
        """`producer` ran init_transactions: its predecessor with the same id is fenced,
        its open transaction committed (a commit under way) or aborted."""
        self.inits += 1
        tid = producer.config["transactional.id"]
        older = self.holders.get(tid)
        self.holders[tid] = producer
        if older is None or older is producer:
            return
        if older.txn_open:
            if older.commit_in_flight and self.in_flight_completes:
                older.complete_commit()
            else:
                older.abort_silently()
        older.go_fatal(KafkaError._FENCED)

    def visible(self, topic: str) -> list[Sent]:
        return [s for s in self.committed if s.topic == topic]


class FencingProducer(FakeProducer):
    def __init__(
        self,
        coordinator: FakeCoordinator,
        topics: dict[str, int],
        clock: FakeClock | None,
        config: dict[str, Any],
    ) -> None:
        super().__init__(topics, clock, config)
        self.coordinator = coordinator

    @property
    def commit_in_flight(self) -> bool:
        return self._commit_in_flight

    def init_transactions(self, timeout: float = -1) -> None:
        super().init_transactions(timeout)
        self.coordinator.take_over(self)

    def commit_transaction(self, timeout: float = -1) -> None:
        super().commit_transaction(timeout)
        self.coordinator.committed.extend(self.committed_txns[-1][0])

    def complete_commit(self) -> None:
        """The coordinator completes a commit this producer had under way."""
        self.commit_timeouts, self.commit_txn_raises = 0, None
        self.commit_transaction()

    def abort_silently(self) -> None:
        """The coordinator aborts this producer's open transaction."""
        with self._cond:
            self._pending.clear()
        self.aborted.extend(self.txn_sent)
        self.txn_sent, self.txn_offsets, self.txn_open = [], [], False
        self._commit_in_flight = False

    def purge(self) -> None:
        """Given up: what becomes of a commit under way is the coordinator's to decide
        when the next producer with this id runs init_transactions."""


class DoneReader:
    """A read_committed consumer of `topic`'s only partition, on the coordinator."""

    def __init__(self, coordinator: FakeCoordinator, topic: str) -> None:
        self.coordinator = coordinator
        self.topic = topic
        self.position_at = -1001  # OFFSET_INVALID until a record was returned
        self._fetch_at = 0
        self.assigned = False
        self.closed = False
        self.reads = 0
        self.isolation = "read_committed"
        self.paused = threading.Event()
        """Set: returns nothing, as a reader of a process frozen or far behind."""

    def _records(self) -> list[Sent]:
        return self.coordinator.visible(self.topic)

    def assign(self, partitions: list[TopicPartition]) -> None:
        assert [(tp.topic, tp.partition) for tp in partitions] == [(self.topic, 0)]
        self.assigned = True
        self._fetch_at = max(0, partitions[0].offset)

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        return 0, len(self._records())

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(self.topic, 0, self.position_at)]

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        assert self.assigned
        assert not self.closed
        records = [] if self.paused.is_set() else self._records()
        start = self._fetch_at
        batch = records[start : start + num_messages]
        if not batch and timeout > 0:  # as a real consumer waits for the next record
            time.sleep(min(timeout, 0.01))
        self._fetch_at = start + len(batch)
        if batch:  # librdkafka moves the position as it returns records
            self.position_at = self._fetch_at
        self.reads += len(batch)
        return [
            Message(topic=self.topic, partition=0, offset=start + i, key=s.key, value=s.value)
            for i, s in enumerate(batch)
        ]

    def close(self) -> None:
        self.closed = True
