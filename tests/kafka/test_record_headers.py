"""`read_headers` on records whose `headers()` misbehaves the way confluent-kafka's does."""

from __future__ import annotations

from typing import Any

import pytest

from delayservice.kafka.record_headers import UNREADABLE, read_headers


class PoisonedRecord:
    """Raises on the first `headers()` call and crashes (here: raises AssertionError) on
    any later one unless `set_headers` replaced the cache, as the real client does."""

    def __init__(self) -> None:
        self.calls = 0
        self.replaced: Any = None
        self.was_replaced = False

    def headers(self) -> Any:
        self.calls += 1
        if self.was_replaced:
            return self.replaced
        if self.calls > 1:
            raise AssertionError("second headers() on a poisoned record would segfault")
        raise SystemError("returned a result with an exception set")

    def set_headers(self, headers: Any) -> None:
        self.replaced, self.was_replaced = headers, True


class PlainRecord:
    def __init__(self, headers: Any) -> None:
        self._headers = headers

    def headers(self) -> Any:
        return self._headers


def test_a_record_that_raises_is_unreadable_and_safe_to_read_again() -> None:
    record = PoisonedRecord()
    assert read_headers(record) is UNREADABLE
    assert read_headers(record) is UNREADABLE
    assert record.headers() == ()  # a stray direct call gets an empty value, not a crash


def test_readable_headers_pass_through_unchanged() -> None:
    headers = [("a", b"1"), ("", None)]
    assert read_headers(PlainRecord(headers)) is headers
    assert read_headers(PlainRecord(None)) is None


def test_a_record_without_set_headers_is_still_reported_unreadable() -> None:
    class Raising:
        def headers(self) -> Any:
            raise SystemError("boom")

    assert read_headers(Raising()) is UNREADABLE


def test_unreadable_is_empty_immutable_and_not_a_list() -> None:
    assert len(UNREADABLE) == 0
    assert not isinstance(UNREADABLE, list)


def test_header_values_keeps_the_last_of_a_name_and_leaves_out_nulls() -> None:
    from delayservice.kafka.record_headers import header_values

    record = PlainRecord([("a", b"1"), ("b", None), ("a", b"2")])
    assert header_values(record) == {"a": b"2"}
    assert header_values(PlainRecord(None)) == {}
    assert header_values(PoisonedRecord()) == {}


@pytest.mark.kafka
def test_real_records_with_a_name_not_utf8_read_as_unreadable_every_time(
    kafka_bootstrap, unique_name
):
    """In a hot loop CPython stops checking a plain `headers()` call for a pending error,
    and the poisoned list comes back silently: 300 records, every third with a name that
    is not UTF-8, read the way the daemon reads them (one by one, and a run at a time),
    must come back UNREADABLE exactly where they are bad, with no error left pending."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from delayservice.kafka.record_headers import headers_of_run
    from tests.kafka.raw_producer import RawProducer

    topic = unique_name("poisoned")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    bad = [i % 3 == 1 for i in range(300)]
    with RawProducer(kafka_bootstrap) as raw:
        for i, is_bad in enumerate(bad):
            name = b"\xff\xfebad" if is_bad else b"fine"
            raw.produce(topic, b"v%d" % i, None, [(b"ok", b"1"), (name, b"x")], 0)
        raw.flush()
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": topic})
    consumer.assign([TopicPartition(topic, 0, 0)])
    records: list[Any] = []
    while len(records) < 300:
        records.extend(m for m in consumer.consume(300, 1.0) if m.error() is None)
    consumer.close()
    outcomes = []
    for record in records[:150]:
        outcomes.append(read_headers(record) is UNREADABLE)
        int("1")  # a checked call: raises if an error was left pending
    outcomes.extend(h is UNREADABLE for h in headers_of_run(records[150:]))
    int("1")
    assert outcomes == bad
    for record, is_bad in zip(records, bad, strict=True):  # neutralized, never poisoned
        assert record.headers() == (() if is_bad else [("ok", b"1"), ("fine", b"x")])


def test_a_run_with_one_unreadable_record_reads_the_others_as_they_are() -> None:
    from delayservice.kafka.record_headers import headers_of_run

    good = [("a", b"1")]
    heads = headers_of_run([PlainRecord(good), PoisonedRecord(), PlainRecord(None)])
    assert heads[0] == good
    assert heads[1] is UNREADABLE
    assert heads[2] is None
