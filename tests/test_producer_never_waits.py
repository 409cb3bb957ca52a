"""`DelayProducer.produce()` never waits for the broker, as librdkafka's does not: partition
counts are read ahead, a delayed record whose topic's count is not known yet waits in
the producer (or fails through its delivery callback), and `flush()` and `close()` bound
the wait. Against a fake wrapped producer whose metadata requests block as an
unreachable broker's do."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from delayservice import partitioners
from delayservice import producer as producer_module
from delayservice.envelope import H_PARTITIONER
from delayservice.held_sends import Held, HeldSends
from delayservice.level.ids import level_place
from delayservice.precise.ids import named_partition
from delayservice.precise.topic_partitions import TopicPartitions
from delayservice.producer import DelayProducer
from tests.test_precise_producer import FakeProducer, _settings

ASSUMED = 3
"""`settings.partitions`, the count `topics create` gives (the settings' default)."""


class DownBroker(FakeProducer):
    """A metadata request waits its whole timeout and fails while `down` is set, as
    librdkafka's does with no broker answering; `up()` brings the broker back."""

    def __init__(self, partitions: int = ASSUMED) -> None:
        super().__init__()
        self.partitions = partitions
        self.down = threading.Event()
        self.down.set()
        self.purged = 0
        self.closed = False

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        if self.down.wait(0) and not self._wait_down(timeout):
            raise KafkaException(
                KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: broker down")
            )
        return super().list_topics(topic, timeout)

    def _wait_down(self, timeout: float) -> bool:
        """True when the broker came back within `timeout`."""
        deadline = time.monotonic() + timeout
        while self.down.is_set():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def up(self) -> None:
        self.down.clear()

    def purge(self, **_kwargs: Any) -> None:
        self.purged += 1

    def close(self) -> bool:
        self.closed = True
        return True


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> DownBroker:
    wrapped = DownBroker()
    monkeypatch.setattr(producer_module, "Producer", lambda _config: wrapped)
    return wrapped


def _producer(config: dict[str, Any] | None = None, **settings: Any) -> DelayProducer:
    return DelayProducer(config or {}, settings=_settings(partitions=ASSUMED, **settings))


def _wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


@pytest.mark.parametrize("precision", ["level", "exact"])
def test_produce_returns_at_once_with_the_broker_away(broker, precision):
    """A benchmark-style bound, on purpose: it checks that produce() does not wait on a
    10 s metadata timeout (it did, on the first delayed send to a topic). 50 ms is far
    above the ~0.1 ms a call takes and far below any network timeout, so a loaded
    machine cannot make it flaky."""
    producer = _producer()
    started = time.perf_counter()
    mids = [producer.produce("orders", b"v", b"k", delay=2, precision=precision) for _ in range(5)]
    took = time.perf_counter() - started
    assert took < 0.05, f"5 produce() calls took {took * 1000:.1f} ms"
    assert broker.sent == []
    assert len(producer) == 5
    assert len(set(mids)) == 5


def test_held_records_go_out_once_the_broker_answers_where_their_ids_say(broker):
    producer = _producer()
    keyed = [producer.produce("orders", b"v", f"k{i}".encode(), delay=2) for i in range(6)]
    exact = producer.produce("orders", b"v", b"k", delay=2, precision="exact")
    broker.up()
    assert producer.flush(10) == 0
    assert len(broker.sent) == 7
    for mid, record in zip(keyed, broker.sent, strict=False):
        place = level_place(mid)
        assert place is not None
        assert (record.topic, record.partition) == ("lv-2", place.partition)
        # Chosen over the count topics create gives: where a key goes once it is known.
        assert record.partition == partitioners.keyed_partition(
            partitioners.DEFAULT, record.key, ASSUMED
        )
    assert broker.sent[-1].partition == named_partition(exact)


def test_an_undelayed_twin_lands_the_same_whatever_the_level_topic_count_was(broker):
    """Invariant 5: the forward's partition comes from the envelope (the application's
    partitioner, or its explicit partition), never from the level topic's count."""
    producer = _producer({"partitioner": "murmur2_random"})
    producer.produce("orders", b"v", b"key-1", delay=2)
    producer.produce("orders", b"v", b"key-1", 4, delay=2)
    broker.up()
    assert producer.flush(10) == 0
    keyed, explicit = (dict(r.headers) for r in broker.sent)
    assert keyed[H_PARTITIONER] == b"murmur2_random"
    assert "delay-partition" not in keyed
    assert explicit["delay-partition"] == b"4"


def test_a_record_sent_once_the_count_is_known_waits_behind_those_held_before_it():
    """A key's records keep their order: the count may become known between a record
    being held and it being released; a later record must not overtake it."""
    sent: list[bytes] = []
    held = HeldSends(lambda topic, value, key, **kw: sent.append(value), timeout=60)
    held.send(Held("lv-1", 0, b"1", b"k", [], {}), routable=False)
    held.send(Held("lv-1", 0, b"2", b"k", [], {}), routable=True)
    held.send(Held("lv-2", 0, b"other topic", b"k", [], {}), routable=True)
    assert sent == [b"other topic"]
    held.release("lv-1", 3, None)
    held.send(Held("lv-1", 0, b"3", b"k", [], {}), routable=True)
    assert sent == [b"other topic", b"1", b"2", b"3"]
    assert len(held) == 0


def test_a_record_the_count_never_came_for_fails_through_its_callback(broker):
    producer = _producer({"message.timeout.ms": 200})
    reports: list[Any] = []
    producer.produce("orders", b"v", delay=2, on_delivery=lambda err, msg: reports.append(err))
    started = time.monotonic()
    assert producer.flush(5) == 0
    assert time.monotonic() - started < 2
    (error,) = reports
    assert error.code() == KafkaError._MSG_TIMED_OUT
    assert "lv-2" in error.str()


def test_flush_and_close_bound_the_wait(broker):
    producer = _producer()
    reports: list[Any] = []
    producer.produce("orders", b"v", delay=2, on_delivery=lambda err, msg: reports.append(err))
    started = time.monotonic()
    assert producer.flush(0.2) == 1
    assert producer.close(0.2) == 1
    took = time.monotonic() - started
    assert took < 2, f"flush(0.2) and close(0.2) took {took:.1f} s"
    assert [e.code() for e in reports] == [KafkaError._PURGE_QUEUE]
    assert broker.closed
    assert len(producer) == 0


def test_a_partition_the_topic_does_not_have_fails_through_the_callback(monkeypatch):
    """Chosen over the count topics create gives, a record sent before the count was
    known may name a partition a smaller topic lacks: it fails, as librdkafka fails a
    send to a partition that does not exist, rather than going elsewhere than its id."""
    small = DownBroker(partitions=1)
    monkeypatch.setattr(producer_module, "Producer", lambda _config: small)
    producer = _producer()
    reports: list[Any] = []
    mids = [
        producer.produce(
            "orders", b"v", f"k{i}".encode(), delay=2, on_delivery=lambda e, m: reports.append(e)
        )
        for i in range(12)
    ]
    small.up()
    assert producer.flush(10) == 0
    misplaced = [m for m in mids if level_place(m).partition >= 1]  # type: ignore[union-attr]
    assert misplaced
    assert len(reports) == len(misplaced)
    assert {e.code() for e in reports} == {KafkaError._UNKNOWN_PARTITION}
    assert all(r.partition == 0 for r in small.sent)


def test_counts_are_read_ahead_when_the_producer_is_made(monkeypatch):
    reads: list[str] = []
    fake = FakeProducer()
    answer = fake.list_topics
    fake.list_topics = lambda topic=None, timeout=-1: reads.append(topic) or answer(topic, timeout)  # type: ignore[method-assign]
    monkeypatch.setattr(producer_module, "Producer", lambda _config: fake)
    producer = _producer()
    _wait_for(lambda: {"lv-1", "lv-2"} <= set(reads))
    producer.produce("orders", b"v", b"k", delay=2)
    assert fake.sent[0].partition == partitioners.keyed_partition(partitioners.DEFAULT, b"k", 5)


def test_topic_partitions_never_asks_the_broker_from_known(broker):
    partitions = TopicPartitions(broker)
    started = time.perf_counter()
    assert partitions.known("t") is None
    assert time.perf_counter() - started < 0.05
    assert broker.metadata_calls == 0
