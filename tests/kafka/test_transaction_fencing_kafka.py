"""What the broker does with a transaction's offsets across a change of owner, on a
real broker and librdkafka: the two rules exactly-once leans on when a partition
changes hands (KIP-447), and the hole left by a transaction that holds none.

A level move made ahead of its message's due time writes a copy and sends no record
of the original's partition; before `OpenInterval.fenced` its transaction held no
offset of that partition, so nothing below stopped a member whose session had expired
from committing it after the partition's next owner had started (docs/faults.md,
scenario 28). The fake producer and consumer of `tests/level/fakes.py` refuse and wait
the same way (`FakeConsumer.group_generation`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tests.conftest import wait_for

if TYPE_CHECKING:  # a class named Test* at module level is one pytest tries to collect
    from tests.conftest import Testbed

pytestmark = pytest.mark.kafka

SESSION_MS = 6_000
"""The broker's least session timeout."""


@pytest.fixture
def clients(testbed: Testbed) -> Iterator[Callable[..., object]]:
    made: list[Consumer | Producer] = []

    def make(kind: str, **config: object) -> object:
        settings = {"bootstrap.servers": testbed.bootstrap, **config}
        client = Consumer(settings) if kind == "consumer" else Producer(settings)
        made.append(client)
        return client

    yield make
    for client in made:
        if isinstance(client, Producer):
            client.flush(5)
            continue
        with contextlib.suppress(RuntimeError):  # closed by the test already
            client.close()


def _member(make: Callable[..., object], group: str, topic: str) -> Consumer:
    """A read_committed member of `group`, once the group has given it `topic`'s
    partition."""
    consumer = make(
        "consumer",
        **{
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": SESSION_MS,
            "partition.assignment.strategy": "cooperative-sticky",
        },
    )
    assert isinstance(consumer, Consumer)
    consumer.subscribe([topic])
    wait_for(
        lambda: bool(consumer.poll(0.2) or True) and bool(consumer.assignment()),
        60,
        f"{group} to assign {topic}",
    )
    return consumer


def _a_member_of_a_group(
    testbed: Testbed, unique_name: Callable[[str], str], make: Callable[..., object]
) -> tuple[str, str, str, Consumer]:
    """A source topic, a topic for copies, a group, and its first member, which owns the
    source's one partition."""
    source = testbed.create_topic(unique_name("fence-source"), 1)
    copies = testbed.create_topic(unique_name("fence-copies"), 1)
    group = unique_name("fence-group")
    return source, copies, group, _member(make, group, source)


def _transactional(make: Callable[..., object], name: str) -> Producer:
    producer = make("producer", **{"transactional.id": name})
    assert isinstance(producer, Producer)
    producer.init_transactions(30)
    return producer


def _visible(make: Callable[..., object], topic: str, last: bytes) -> list[bytes]:
    """What a read_committed reader of `topic` sees, up to the record `last`."""
    reader = make(
        "consumer",
        **{"group.id": f"{topic}-reader", "isolation.level": "read_committed"},
    )
    assert isinstance(reader, Consumer)
    reader.assign([TopicPartition(topic, 0, 0)])
    seen: list[bytes] = []

    def read() -> bool:
        message = reader.poll(0.2)
        if message is not None and message.error() is None:
            seen.append(message.value() or b"")
        return last in seen

    wait_for(read, 30, f"{last!r} on {topic}")
    return seen


def test_offsets_of_a_generation_past_are_refused_and_a_transaction_without_any_is_not(
    testbed: Testbed, unique_name: Callable[[str], str], clients: Callable[..., object]
) -> None:
    source, copies, group, first = _a_member_of_a_group(testbed, unique_name, clients)
    metadata = first.consumer_group_metadata()
    producer = _transactional(clients, unique_name("fence-txn"))

    first.close()  # its session ends: the group moves on without it
    _member(clients, group, source)

    producer.begin_transaction()
    producer.produce(copies, b"fenced copy")
    with pytest.raises(KafkaException) as raised:
        producer.send_offsets_to_transaction([TopicPartition(source, 0, 0)], metadata, 30)
    error = raised.value.args[0]
    assert error.code() in (KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID), error
    assert error.txn_requires_abort(), error
    producer.abort_transaction(30)

    producer.begin_transaction()  # the same copy with no offset: nothing to check
    producer.produce(copies, b"unfenced copy")
    producer.commit_transaction(30)
    assert _visible(clients, copies, b"unfenced copy") == [b"unfenced copy"]


def test_a_new_owner_starts_only_once_a_transaction_holding_its_offsets_ends(
    testbed: Testbed, unique_name: Callable[[str], str], clients: Callable[..., object]
) -> None:
    source, copies, group, first = _a_member_of_a_group(testbed, unique_name, clients)
    producer = _transactional(clients, unique_name("wait-txn"))
    producer.begin_transaction()
    producer.produce(copies, b"copy")
    offsets = [TopicPartition(source, 0, 0)]
    producer.send_offsets_to_transaction(offsets, first.consumer_group_metadata(), 30)

    first.close()
    second = _member(clients, group, source)
    with pytest.raises(KafkaException) as raised:
        second.committed(offsets, timeout=3)
    assert raised.value.args[0].code() == KafkaError._TIMED_OUT, raised.value

    producer.commit_transaction(30)
    (start,) = second.committed(offsets, timeout=30)
    assert start.error is None, start
    assert start.offset == 0, start
    assert _visible(clients, copies, b"copy") == [b"copy"]
