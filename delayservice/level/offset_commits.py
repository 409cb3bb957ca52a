"""At-least-once commits of a level worker: the offsets the forwarder made durable,
asked of the broker and counted committed only once it confirms them.

In exactly-once mode none of this runs: the offsets travel in the forwarder's
transactions. Kept apart from the loop so that what is wanted, asked for and confirmed
per partition has one keeper, whichever of the loop's turns, rebalance callbacks or
shutdown commits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from prometheus_client import Counter

from delayservice.forward.buffer import TP
from delayservice.kafka.client_seam import ConsumerClient
from delayservice.level.partition_names import tp_of

log = logging.getLogger(__name__)

Answered = Callable[
    [KafkaError | None, list[TopicPartition] | None],
    tuple[list[TopicPartition], list[TopicPartition]],
]
"""The broker's answer to a commit, split into what it confirmed and what failed
(`ConsumerThread._answered`, which counts and logs it)."""


class OffsetCommits:
    """One per consumer loop; the broker's answers come on its thread too."""

    def __init__(
        self, name: str, topics: Collection[str], answered: Answered, commit_failures: Counter
    ) -> None:
        self._name = name
        self._topics = topics
        self._answered = answered
        self._m_commit_failures = commit_failures
        self.confirmed: dict[TP, int] = {}
        """partition -> the last offset the broker confirmed as committed."""
        self._wanted: dict[TP, int] = {}  # durable offsets not confirmed yet
        self._asked: dict[TP, int] = {}  # of those, asked for and not answered

    def uncommitted(self) -> dict[TP, int]:
        """Offsets made durable but not yet confirmed committed."""
        return dict(self._wanted)

    def want(self, durable: Mapping[TP, int], owned: Collection[TP]) -> None:
        """Offsets the forwarder made durable, of the partitions still owned."""
        self._wanted.update({tp: o for tp, o in durable.items() if tp in owned})

    def wanting(self) -> bool:
        return bool(self._wanted)

    def forget(self, gone: Collection[TP]) -> None:
        """Partitions let go: nothing of them is asked for again."""
        for tp in gone:
            self._wanted.pop(tp, None)
            self._asked.pop(tp, None)

    def forget_confirmed(self, gone: Collection[TP]) -> None:
        for tp in gone:
            self.confirmed.pop(tp, None)

    def commit(self, consumer: ConsumerClient, *, asynchronous: bool) -> None:
        """Ask the broker to commit what the forwarder made durable; an offset counts as
        committed only once the broker confirms it, and is asked for again otherwise."""
        wanted = {tp: o for tp, o in self._wanted.items() if self.confirmed.get(tp) != o}
        self._wanted = wanted
        ask = {
            tp: o for tp, o in wanted.items() if asynchronous is False or self._asked.get(tp) != o
        }
        if not ask:
            return
        offsets = [TopicPartition(tp[0], tp[1], o) for tp, o in ask.items()]
        if asynchronous:
            self._asked.update(ask)
            consumer.commit(offsets=offsets, asynchronous=True)
        else:
            self.confirm(None, consumer.commit(offsets=offsets, asynchronous=False))

    def commit_on_revoke(self, consumer: ConsumerClient, durable: Mapping[TP, int]) -> None:
        """Commit, before they go, what the forwarder made durable of revoked partitions."""
        safe = [
            TopicPartition(tp[0], tp[1], o)
            for tp, o in durable.items()
            if self.confirmed.get(tp) != o
        ]
        if not safe:
            return
        try:
            results = consumer.commit(offsets=safe, asynchronous=False)
            self._count(None, results)
        except KafkaException as exc:
            self._m_commit_failures.inc()
            log.warning(
                "%s: commit on revoke failed (%s); records will be re-read", self._name, exc
            )

    def confirm(self, error: KafkaError | None, partitions: list[TopicPartition] | None) -> None:
        """A commit's result: only what the broker confirmed counts as committed."""
        if error is not None and error.code() == KafkaError._NO_OFFSET:
            return  # nothing was asked for
        self._count(error, partitions)

    def _count(self, error: KafkaError | None, partitions: list[TopicPartition] | None) -> None:
        done, failed = self._answered(error, partitions)
        if error is not None:
            self._asked.clear()
            return
        for tp, offset in ((tp_of(tp), tp.offset) for tp in done if tp.topic in self._topics):
            self.confirmed[tp] = offset
            self._asked.pop(tp, None)
            if self._wanted.get(tp) == offset:
                del self._wanted[tp]
        for failure in failed:
            self._asked.pop(tp_of(failure), None)
