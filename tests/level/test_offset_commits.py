"""At-least-once commits: an offset counts as committed only once the broker confirms
it, an offset asked for is not asked again until answered, and a partition let go is
never asked for again."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, TopicPartition
from prometheus_client import CollectorRegistry, Counter

from delayservice.level.offset_commits import OffsetCommits

TOPIC = "level-5s"


class CommitRecorder:
    """A consumer that records the commits asked of it and answers none by itself."""

    def __init__(self) -> None:
        self.asked: list[tuple[list[tuple[int, int]], bool]] = []

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> Any:
        self.asked.append(([(tp.partition, tp.offset) for tp in offsets], asynchronous))
        return None if asynchronous else offsets


def split(
    error: KafkaError | None, partitions: list[TopicPartition] | None
) -> tuple[list[TopicPartition], list[TopicPartition]]:
    given = partitions or []
    if error is not None:
        return [], list(given)
    return [tp for tp in given if tp.error is None], [tp for tp in given if tp.error]


def commits() -> OffsetCommits:
    failures = Counter("failures", "", registry=CollectorRegistry())
    return OffsetCommits("w", {TOPIC}, split, failures)


def test_an_offset_counts_committed_only_once_the_broker_confirms_it() -> None:
    book, consumer = commits(), CommitRecorder()
    book.want({(TOPIC, 0): 5, (TOPIC, 1): 3}, owned={(TOPIC, 0), (TOPIC, 1)})
    book.commit(consumer, asynchronous=True)  # type: ignore[arg-type]
    assert book.confirmed == {}
    assert book.uncommitted() == {(TOPIC, 0): 5, (TOPIC, 1): 3}
    book.confirm(None, [TopicPartition(TOPIC, 0, 5)])
    assert book.confirmed == {(TOPIC, 0): 5}
    assert book.uncommitted() == {(TOPIC, 1): 3}


def test_an_offset_asked_for_is_asked_again_only_after_its_answer() -> None:
    book, consumer = commits(), CommitRecorder()
    book.want({(TOPIC, 0): 5}, owned={(TOPIC, 0)})
    book.commit(consumer, asynchronous=True)  # type: ignore[arg-type]
    book.commit(consumer, asynchronous=True)  # type: ignore[arg-type]
    assert consumer.asked == [([(0, 5)], True)]
    book.confirm(KafkaError(KafkaError._TRANSPORT), [TopicPartition(TOPIC, 0, 5)])
    book.commit(consumer, asynchronous=True)  # type: ignore[arg-type]
    assert consumer.asked == [([(0, 5)], True), ([(0, 5)], True)]


def test_only_owned_partitions_are_wanted_and_one_let_go_is_not_asked_again() -> None:
    book, consumer = commits(), CommitRecorder()
    book.want({(TOPIC, 0): 5, (TOPIC, 1): 3}, owned={(TOPIC, 0)})
    assert book.uncommitted() == {(TOPIC, 0): 5}
    book.forget({(TOPIC, 0)})
    assert not book.wanting()
    book.commit(consumer, asynchronous=False)  # type: ignore[arg-type]
    assert consumer.asked == []


def test_a_revoke_commits_only_what_is_not_confirmed_yet() -> None:
    book, consumer = commits(), CommitRecorder()
    book.confirm(None, [TopicPartition(TOPIC, 0, 5)])
    book.commit_on_revoke(consumer, {(TOPIC, 0): 5, (TOPIC, 1): 3})  # type: ignore[arg-type]
    assert consumer.asked == [([(1, 3)], False)]
    assert book.confirmed == {(TOPIC, 0): 5, (TOPIC, 1): 3}
