"""Replies to markers: their format read back whatever bytes come, and a send that
says it failed unless the broker acknowledged every reply."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError
from hypothesis import given
from hypothesis import strategies as st

from delayservice.markers.replies import (
    Answered,
    MarkerReplies,
    MarkerRepliesError,
    MarkerReply,
    parse_reply,
    reply_key,
)


class Producer:
    def __init__(self, *, error: KafkaError | None = None, unflushed: int = 0) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []
        self._reports: list[Any] = []
        self._error = error
        self._unflushed = unflushed

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: Any) -> None:
        self.sent.append((topic, value, key))
        self._reports.append(on_delivery)

    def flush(self, timeout: float = -1) -> int:
        for report in self._reports:
            report(self._error, None)
        return self._unflushed


def _replies(producer: Producer) -> MarkerReplies:
    return MarkerReplies("outcomes", "precise", producer, 3, lambda p: "owner" if p else None)


def test_each_reply_is_keyed_by_where_its_marker_landed_and_reads_back():
    producer = Producer()
    _replies(producer).send(
        [
            Answered(1, 17, MarkerReply("reschedule", "m-1", "moved", 1_800_000_000_000)),
            Answered(0, 4, MarkerReply("cancel", "m-2", "accepted")),
        ]
    )
    (t1, v1, k1), (_, v2, k2) = producer.sent
    assert (t1, k1, k2) == ("outcomes", reply_key("precise", 1, 17), b"precise:0:4")
    assert parse_reply(v1) == MarkerReply(
        "reschedule", "m-1", "moved", 1_800_000_000_000, 3, "owner"
    )
    assert parse_reply(v2) == MarkerReply("cancel", "m-2", "accepted", None, 3, None)


@pytest.mark.parametrize(
    "producer",
    [Producer(error=KafkaError(KafkaError._MSG_TIMED_OUT)), Producer(unflushed=1)],
    ids=["refused", "not acknowledged"],
)
def test_a_reply_the_broker_did_not_acknowledge_fails_the_send(producer):
    with pytest.raises(MarkerRepliesError) as caught:
        _replies(producer).send([Answered(0, 1, MarkerReply("cancel", "m", "accepted"))])
    assert caught.value.retriable


@given(st.binary(max_size=300))
def test_any_bytes_read_as_a_reply_or_as_nothing(raw):
    reply = parse_reply(raw)
    assert reply is None or isinstance(reply.message_id, str)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"v":2,"kind":"cancel","id":"m","outcome":"x"}',
        b'{"v":1,"kind":"cancel","id":5,"outcome":"x"}',
        b'{"v":1,"kind":"cancel","id":"m","outcome":"x","due_ms":"9"}',
        b'{"v":1,"kind":"cancel","id":"m","outcome":"x","member":true}',
        b'{"v":1,"kind":"cancel","id":"m"}',
        b"[1,2]",
        b"",
        None,
    ],
)
def test_replies_of_the_wrong_shape_are_ignored(raw):
    assert parse_reply(raw) is None
