"""The two topics the marker reader reads (the markers and their outcomes): which of
their partitions it holds, the partitions added while it runs, and a topic deleted and
made again.

Apart from the reading itself because each of these is a way for the gate to pass
markers it never read: a partition added and never assigned, or a topic made again
whose offsets start over below where the old one was read. What is held here is what
the reader must know to refuse both.

A topic deleted and made again while the reader runs (`topics create` run again after a
mistake) starts its offsets over: read on from where the old one was read, the reader
would skip the new topic's markers, and the gate would pass them as read. So each
pass, once it has both topics' ends, asks for the topics' ids: a changed id logs a
WARNING naming the topic, keeps the old topic's markers for the records they may
concern (answered no more: their answer keys now name the new topic's), and the new
topic is read from its start before the gate moves again; readiness says so meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from confluent_kafka import KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient

from delayservice.forward.buffer import TP
from delayservice.kafka import client_config
from delayservice.level.markers.book import MarkerBook
from delayservice.level.markers.gate import MarkerGate
from delayservice.settings import Settings

log = logging.getLogger(__name__)

PASS_TIMEOUT_S: Final = 5.0

TopicIds = Callable[[list[str]], dict[str, str]]
"""Topic names -> their topic ids (which change when a topic is made again)."""


class TopicRemadeError(Exception):
    """A topic the reader reads was deleted and made again: read it again from its start."""


def admin_topic_ids(settings: Settings) -> TopicIds:
    """The topic ids, as the broker's admin API gives them (one round trip)."""
    admin: AdminClient | None = None

    def topic_ids(names: list[str]) -> dict[str, str]:
        nonlocal admin
        if admin is None:
            admin = AdminClient(client_config.admin(settings))
        futures = admin.describe_topics(TopicCollection(names), request_timeout=PASS_TIMEOUT_S)
        return {name: str(future.result().topic_id) for name, future in futures.items()}

    return topic_ids


def partitions_of(consumer: Any, topic: str) -> list[int]:
    meta = consumer.list_topics(topic, timeout=PASS_TIMEOUT_S).topics.get(topic)
    if meta is not None and meta.error is not None:  # a pass waits and asks again
        raise KafkaException(meta.error)
    if meta is None or not meta.partitions:
        why = meta.error if meta is not None and meta.error is not None else "no partitions"
        raise RuntimeError(f"{topic}: {why}")
    return sorted(meta.partitions)


class MarkerTopics:
    def __init__(
        self,
        settings: Settings,
        book: MarkerBook,
        gate: MarkerGate,
        now_ms: Callable[[], int],
        topic_ids: TopicIds | None,
    ) -> None:
        """`topic_ids`: how the topics' ids are asked for (None: never; a topic made
        again is then not noticed)."""
        self.markers_topic = settings.markers_topic
        self.outcomes_topic = settings.markers_outcomes_topic
        self._book = book
        self._gate = gate
        self._now_ms = now_ms
        self.topic_ids = topic_ids
        self.assigned: list[TopicPartition] = []
        self._counts: dict[str, int] = {}
        """Per topic read, the most partitions it was seen with (a growth is told once)."""
        self.ids: dict[str, str] = {}
        """The id of each topic read, as last seen."""
        self._from_start: set[str] = set()
        """Topics made again: the next consumer reads them from their start."""
        self.remade: str | None = None
        """Readiness: the topic made again, until a pass has read the new one through."""

    @property
    def names(self) -> tuple[str, str]:
        return self.markers_topic, self.outcomes_topic

    def assign_all(self, consumer: Any, read_to: dict[TP, int]) -> None:
        """Every partition of both topics, as `consumer` lists them now (a topic made
        again while no consumer was open is read from its start)."""
        self.check_ids(read_to)
        self.assigned = [
            TopicPartition(topic, p)
            for topic in self.names
            for p in self._told(topic, partitions_of(consumer, topic))
        ]
        self._tell_gate(self.assigned)

    def _told(self, topic: str, listed: list[int]) -> list[int]:
        """`listed`, `topic`'s partitions now, with a WARNING the first time the topic
        is seen grown."""
        known = self._counts.get(topic)
        if known is not None and len(listed) > known:
            log.warning(
                "markers: %s grew from %d to %d partitions while the daemon ran; the new"
                " ones are read from their beginning before the gate moves on",
                topic,
                known,
                len(listed),
            )
        self._counts[topic] = max(len(listed), known or 0)
        if topic == self.markers_topic:
            self._gate.markers_count(len(listed), self._now_ms())
        return listed

    def _tell_gate(self, tps: list[TopicPartition]) -> None:
        """The gate shuts the records whose markers may be on a partition not read yet."""
        self._gate.read_parts(
            [tp.partition for tp in tps if tp.topic == self.markers_topic],
            [tp.partition for tp in tps if tp.topic == self.outcomes_topic],
        )

    def follow_growth(
        self, consumer: Any, listed: dict[str, list[int]], read_to: dict[TP, int]
    ) -> dict[TP, int]:
        """Assign the partitions added to either topic since it was listed, from their
        beginning, and return their ends: the pass reads them to there before the gate
        moves. `listed` was asked for after the pass noted its time, so a marker
        acknowledged before then is on a partition it names."""
        held = {(tp.topic, tp.partition) for tp in self.assigned}
        added = [
            TopicPartition(topic, p)
            for topic, partitions in listed.items()
            for p in self._told(topic, partitions)
            if (topic, p) not in held
        ]
        if not added:
            return {}
        for topic in {tp.topic for tp in added}:  # the reading consumer learns of them too
            partitions_of(consumer, topic)
        marks = {
            (tp.topic, tp.partition): consumer.get_watermark_offsets(tp, PASS_TIMEOUT_S, False)
            for tp in added
        }
        consumer.incremental_assign([TopicPartition(*tp, low) for tp, (low, _) in marks.items()])
        for tp, (low, _) in marks.items():
            read_to[tp] = low
        self.assigned = [*self.assigned, *added]
        self._tell_gate(added)
        return {tp: high for tp, (_, high) in marks.items()}

    def starts(self, consumer: Any, since_ms: int, read_to: dict[TP, int]) -> list[TopicPartition]:
        """Where each partition held is read from: the first record appended at
        `since_ms` or later (the end when none is), the start of a topic made again."""
        asked = [TopicPartition(tp.topic, tp.partition, max(0, since_ms)) for tp in self.assigned]
        found = consumer.offsets_for_times(asked, timeout=PASS_TIMEOUT_S)
        out = []
        for tp in found:
            if tp.error is not None:
                raise KafkaException(tp.error)
            offset = tp.offset
            if tp.topic in self._from_start:  # made again: every record of it is new
                offset = consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=PASS_TIMEOUT_S, cached=False
                )[0]
            if offset < 0:  # nothing that recent: from the end
                offset = consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=PASS_TIMEOUT_S, cached=False
                )[1]
            out.append(TopicPartition(tp.topic, tp.partition, offset))
            read_to[(tp.topic, tp.partition)] = offset
        self._from_start.clear()
        return out

    def check_ids(self, read_to: dict[TP, int]) -> set[str]:
        """The topics made again since their ids were last seen: each told once, with a
        WARNING, its positions in `read_to` dropped, and read again from its start by
        the next consumer."""
        if self.topic_ids is None:
            return set()
        topics = list(self.names)
        seen = self.topic_ids(topics)
        remade = {t for t in topics if t in self.ids and seen.get(t) != self.ids[t]}
        for topic in sorted(remade):
            log.warning(
                "markers: %s was deleted and made again while the daemon ran (topic id %s,"
                " now %s); reading the new one from its start, level records wait until it"
                " is read",
                topic,
                self.ids[topic],
                seen.get(topic),
            )
            self._from_start.add(topic)
            self._counts.pop(topic, None)
            for tp in [tp for tp in read_to if tp[0] == topic]:
                del read_to[tp]
            if topic == self.markers_topic:
                self._book.retire(topic)
            self.remade = topic
        self.ids.update(seen)
        return remade
