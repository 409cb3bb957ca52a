"""Which partitions of the precise topic an intake reads, and where it reads each from.

Placement is static (see `placement`), so the consumer is assigned its partitions
rather than subscribed: a rebalance would strand the records on this instance's disk.
Its offsets still live under a group id of its own, one per member. Partitions the
topic gains are assigned as the partition count is read again (`assign`).

Each partition starts from the later of the broker's committed offset and the one
this data directory's intake last committed (`intake_offsets`), and the intake has
caught up (`caught_up`) once it has read every record the topic held when it started.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from delayservice.kafka.client_seam import ConsumerClient
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.precise.intake.offset_ledger import LevelLedger
from delayservice.precise.placement import Placement, Role
from delayservice.precise.storage.intake_offsets import IntakeOffsets
from delayservice.precise.storage.slot_store import SlotStore
from delayservice.precise.wheel.wheel import Wheel

log = logging.getLogger(__name__)


class PartitionReading:
    """The partitions one intake reads: each assigned from where it was left, what its
    data directory holds of it, and how far the intake is from having caught up. The
    consumer each method is given is the intake's present client."""

    def __init__(
        self,
        topic: str,
        placement: Placement,
        ledger: LevelLedger,
        store: SlotStore,
        wheel: Wheel,
        roles: dict[int, Role],
        metrics: ServiceMetrics,
        *,
        intake_offsets: IntakeOffsets,
        level_name: str,
        on_caught_up: Callable[[], None],
    ) -> None:
        """`roles` is filled with this member's role per partition as partitions are
        assigned (the intake's dict, shared). `on_caught_up` runs once, when
        `caught_up` is set."""
        self.topic = topic
        self._placement = placement
        self._ledger = ledger
        self._store = store
        self._wheel = wheel
        self.roles = roles
        self._offsets = intake_offsets
        self._on_caught_up = on_caught_up
        self.reading: set[int] = set()  # partitions assigned to the present client
        self._in_flight = intake_offsets.in_flight()
        """partition -> end of the batch it was writing at the last stop, until read again."""
        self._origin_checked: set[int] = set()
        self._m_assigned = metrics.assigned_partitions.labels(level_name)
        self.assigned = threading.Event()
        self.caught_up = threading.Event()
        """Every record the precise topic held when the intake started (per partition, the
        end offset at its first assignment) is on disk or in memory: until then, records
        due soon may still be unread, and the daemon does not say it is ready."""
        self._catch_up: dict[int, int] = {}  # partition -> end offset to read up to
        self.records_left = 0

    def replaced(self) -> None:
        """The intake's client was replaced: the new one reads from where this left."""
        self.reading.clear()

    def assign(self, consumer: ConsumerClient) -> None:
        """Assign this member's partitions to the present client: any the topic has
        gained since, and all of them to a client that replaced a failed one."""
        metadata = consumer.list_topics(self.topic, timeout=10.0)
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None:
            raise KafkaException(topic.error if topic is not None else KafkaError._UNKNOWN_TOPIC)
        roles = self._placement.mine(len(topic.partitions))
        new = [p for p in roles if p not in self.reading]
        if new:
            positions = self._start_positions(consumer, new)
            consumer.incremental_assign(positions)
            self.reading.update(new)
            self.roles.update(roles)
            self._m_assigned.set(len(self.roles))
            log.info(
                "%s: reading partitions %s",
                self.topic,
                ", ".join(f"{p} ({roles[p].value})" for p in sorted(new)),
            )
        self.assigned.set()

    def _start_positions(
        self, consumer: ConsumerClient, partitions: list[int]
    ) -> list[TopicPartition]:
        """Where to read each partition from: after what this intake has read already
        (a replaced client: whatever is pending settles as before), else from the
        committed offset, fetched here rather than left to the client: an offset
        fetch that failed during a coordinator move left a partition unread for good."""
        held = self._ledger.partitions
        resumed = [
            TopicPartition(self.topic, p, next_offset)
            for p in partitions
            if p in held and (next_offset := held[p].next_offset) is not None
        ]
        fresh = [p for p in partitions if p not in {tp.partition for tp in resumed}]
        if not fresh:
            return resumed
        wanted = [TopicPartition(self.topic, p) for p in fresh]
        positions = consumer.committed(wanted, timeout=10.0)
        for tp in positions:
            if tp.error is not None:
                raise KafkaException(tp.error)
        for tp in positions:
            ledger = self._ledger.assign(tp.partition)
            if tp.offset >= 0:
                # Durable up to here already: progress reports may say so at once.
                ledger.last_committed = tp.offset
            start = self._resume_from(consumer, tp.partition, tp.offset)
            if start >= 0:
                # A fresh data directory holds records from here on.
                ledger.next_offset = tp.offset = start
                self.check_origin(tp.partition, start)
            else:
                tp.offset = OFFSET_BEGINNING  # nothing committed yet: from the start
        if not self.caught_up.is_set():
            for tp in positions:
                _, end = consumer.get_watermark_offsets(
                    TopicPartition(self.topic, tp.partition), timeout=10.0
                )
                if end > max(tp.offset, 0):
                    self._catch_up[tp.partition] = end
        return [*resumed, *positions]

    def _resume_from(self, consumer: ConsumerClient, partition: int, committed: int) -> int:
        """Where to read `partition` from: the offset this data directory's intake last
        committed, when the broker's committed offset is behind it (a commit that had
        not landed before a crash), else the broker's. The records in between are on
        disk already; read again, one whose slot was sent and deleted would go twice.
        A local offset past the partition's end (the topic was made again) is ignored."""
        local = self._offsets.resume(partition)
        if local is None or local <= committed:
            return committed
        _, end = consumer.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=10.0)
        if local > end:
            log.warning(
                "%s[%d]: this data directory read up to offset %d, but the partition ends at "
                "%d (made again?); reading from the committed offset",
                self.topic,
                partition,
                local,
                end,
            )
            return committed
        log.info(
            "%s[%d]: resuming at offset %d, where this data directory's intake stopped "
            "(committed: %s)",
            self.topic,
            partition,
            local,
            committed if committed >= 0 else "none",
        )
        return local

    def read_again(self) -> None:
        """Tell the wheel of each partition whose batch in flight at the last stop has
        been read (and written) again, or will not be read here at all: its finished
        slots may go (`Wheel.read_again`)."""
        if not self._in_flight:
            return
        held = self._ledger.partitions
        done = [
            p
            for p, end in self._in_flight.items()
            if (p in held and (held[p].next_offset or 0) >= end)
            or (self.assigned.is_set() and p not in self.roles)
        ]
        for partition in done:
            del self._in_flight[partition]
            self._wheel.read_again(partition)

    def read_to(self, consumer: ConsumerClient, partitions: list[int]) -> dict[int, int]:
        """Per partition, the offset read and handled up to: the consumer's position,
        which steps over transaction markers, or the ledger's, which a partition has
        from its assignment on (the position is unknown until a record is read, and
        again after a seek back to a failed batch)."""
        held = self._ledger.partitions
        out: dict[int, int] = {}
        for tp in consumer.position([TopicPartition(self.topic, p) for p in partitions]):
            ledger = held.get(tp.partition)
            known = ledger.next_offset if ledger is not None else None
            out[tp.partition] = max(tp.offset, -1 if known is None else known)
        return out

    def check_caught_up(self, consumer: ConsumerClient) -> None:
        """Drop the partitions whose position reached the end they had at start (the
        position moves past transaction markers, which no record shows)."""
        if self._catch_up:
            tps = [TopicPartition(self.topic, p) for p in self._catch_up]
            left = 0
            for tp in consumer.position(tps):
                end = self._catch_up[tp.partition]
                if tp.offset >= end:
                    del self._catch_up[tp.partition]
                else:
                    left += end - max(tp.offset, 0)
            self.records_left = left
        if not self._catch_up and self.assigned.is_set():
            self.records_left = 0
            self.caught_up.set()
            self._on_caught_up()
            log.info("%s: caught up with the records it held at start", self.topic)

    def check_origin(self, partition: int, offset: int) -> None:
        """Remember the first offset this data directory holds for the partition: an
        owner whose disk was lost reports progress only from there on, so replicas keep
        what went with the old disk."""
        if partition in self._origin_checked:
            return
        if self._store.origin(partition) is None:
            self._store.set_origin(partition, offset)
            if offset > 0:
                log.warning(
                    "%s[%d]: this data directory starts at offset %d; records before it "
                    "were held by an earlier data directory (replicas keep them)",
                    self.topic,
                    partition,
                    offset,
                )
        self._origin_checked.add(partition)
