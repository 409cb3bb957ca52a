"""What the group's rebalances do to a level worker, run by the client on the consumer
thread during a read.

On revoke the forwarder first reaches a commit point for the partitions (flush and
commit, or commit the transaction) and lets them go; on loss they are dropped without
committing; an assignment starts each partition where `StartOffsets` says. Nothing
here may wait on the broker beyond that: a callback holds the rebalance with it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from prometheus_client import Counter

from delayservice.forward.buffer import TP
from delayservice.forward.forwarder import Forwarder
from delayservice.kafka.client_errors import raised_by
from delayservice.kafka.client_seam import ConsumerClient
from delayservice.level import start_offsets
from delayservice.level.offset_commits import OffsetCommits
from delayservice.level.partition_group import PartitionGroup
from delayservice.level.partition_names import named, tp_of
from delayservice.level.reading_state import ReadingState
from delayservice.level.start_offsets import Fallback, StartOffsets

log = logging.getLogger(__name__)

Callback = Callable[[ConsumerClient, list[TopicPartition]], None]


class Rebalances:
    """One per consumer loop."""

    def __init__(
        self,
        name: str,
        reading: ReadingState,
        group: PartitionGroup,
        forwarder: Forwarder,
        commits: OffsetCommits,
        starts: StartOffsets,
        fallback: Callable[[], Fallback | None],
        loop_errors: Counter,
    ) -> None:
        """`fallback`: where a partition with no committed offset in this group starts
        instead, as it stands when the partition starts."""
        self._name = name
        self._reading = reading
        self._group = group
        self._forwarder = forwarder
        self._exactly_once = forwarder.transactional
        self._commits = commits
        self._starts = starts
        self._fallback = fallback
        self._m_loop_errors = loop_errors

    def subscribe(
        self, consumer: ConsumerClient, topics: list[str], current: Callable[[], bool]
    ) -> None:
        """Subscribe `consumer`, its callbacks ignored once `current` says it was replaced."""
        consumer.subscribe(
            topics,
            on_assign=self._guarded(self._assigned, current),
            on_revoke=self._guarded(self._revoked, current),
            on_lost=self._guarded(self._lost, current),
        )

    def _guarded(
        self, callback: Callback, current: Callable[[], bool]
    ) -> Callable[[Any, list[TopicPartition]], None]:
        """An exception inside a rebalance callback would surface from consume(); and a
        replaced client's callbacks (while it closes) are ignored."""

        def run(consumer: Any, partitions: list[TopicPartition]) -> None:
            if not current():
                return
            failed = raised_by(lambda: callback(consumer, partitions))  # a bare KafkaError too
            if failed is not None:
                self._m_loop_errors.inc()
                log.error("%s: rebalance callback failed", self._name, exc_info=failed)

        return run

    def _assigned(self, consumer: ConsumerClient, partitions: list[TopicPartition]) -> None:
        start = self._starts.find(
            consumer,
            partitions,
            self._fallback(),
            give_up_after_s=start_offsets.ASSIGN_ASK_LIMIT_S,
            asking="an assignment",
        )
        if start is None:
            return  # stopping, or the client is to be replaced: nothing of it is read
        consumer.incremental_assign(start)
        for assigned in start:
            tp = tp_of(assigned)
            self._group.assign(tp)
            self._reading.assigned(tp, assigned.offset)
        self._reading.unassigned_since = None
        self._reading.first_assignment.set()
        log.info("%s: assigned %s", self._name, named(map(tp_of, start)))

    def _revoked(self, consumer: ConsumerClient, partitions: list[TopicPartition]) -> None:
        gone = {tp_of(tp) for tp in partitions}
        if self._exactly_once:
            self.hand_metadata(consumer)
        durable = self.let_go(gone, commit=True)
        if not self._exactly_once:
            self._commits.commit_on_revoke(consumer, durable or {})
        self._commits.forget_confirmed(gone)
        log.info("%s: revoked %s", self._name, named(gone))

    def _lost(self, _consumer: ConsumerClient, partitions: list[TopicPartition]) -> None:
        gone = {tp_of(tp) for tp in partitions}
        self.let_go(gone, commit=False)
        self._commits.forget_confirmed(gone)
        if not self._reading.owned and self._reading.unassigned_since is None:
            self._reading.unassigned_since = time.monotonic()
        log.warning("%s: lost %s", self._name, named(gone))

    def hand_metadata(self, consumer: ConsumerClient) -> None:
        """Give the forwarder the group metadata its transactions commit offsets with;
        while the client has none (closing, between generations) it keeps the last."""
        try:
            self._forwarder.inbox.group_metadata = consumer.consumer_group_metadata()
        except (RuntimeError, KafkaException) as exc:
            log.debug("%s: no group metadata now: %s", self._name, exc)

    def let_go(self, gone: set[TP], *, commit: bool) -> dict[TP, int] | None:
        """The forwarder commits (or drops) what it holds of `gone`, then they are
        forgotten here too; returns what it made durable for them (at-least-once)."""
        durable = self._forwarder.handover(gone, commit=commit)
        self._group.drop(gone)
        self._reading.let_go(gone)
        self._commits.forget(gone)
        # A hand-over that ended in an unknown outcome leaves a re-seek asked for. It is
        # done by the next iteration, never here: in a rebalance callback a committed()
        # or seek() waiting on a frozen broker would hold the rebalance with it.
        return durable
