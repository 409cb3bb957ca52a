"""`DelayProducer.produce()` never waits for the broker, as librdkafka's does not: partition
counts are read ahead, a delayed record whose topic's count is not known yet waits in
the producer (or fails through its delivery callback), it goes out in the order sent as
soon as the count is known, and `flush()` and `close()` bound the wait. Against a fake
wrapped producer whose metadata requests block as an unreachable broker's do."""

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
from delayservice.markers.level_ids import level_place
from delayservice.markers.precise_ids import named_partition, precise_id
from delayservice.markers.topic_partitions import TopicPartitions
from delayservice.producer import DelayProducer
from tests.test_precise_producer import FakeProducer, _settings

ASSUMED = 3
"""`settings.partitions`, the count `topics create` gives (the settings' default)."""


class DownBroker(FakeProducer):
    """A metadata request waits until the broker is `up()` (failing after its timeout,
    as librdkafka's does with no broker answering), then answers after `latency`."""

    def __init__(
        self, partitions: int = ASSUMED, latency: float = 0.0, refused: bool = False
    ) -> None:
        """`refused`: a request fails at once while down (a connection refused)."""
        super().__init__()
        self.partitions = partitions
        self.latency = latency
        self.refused = refused
        self.down = threading.Event()
        self.down.set()
        self.closed = False

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        deadline = time.monotonic() + timeout
        while self.down.is_set():
            if self.refused or time.monotonic() >= deadline:
                raise KafkaException(
                    KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: broker down")
                )
            time.sleep(0.005)
        time.sleep(self.latency)
        return super().list_topics(topic, timeout)

    def up(self) -> None:
        self.down.clear()

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


@pytest.mark.parametrize("precision", ["level", "exact"])
def test_produce_returns_at_once_with_the_broker_away(broker, precision):
    """A bound on purpose: produce() must not wait on a metadata timeout (the first
    delayed send to a topic waited up to 10 s). 50 ms is far above the ~0.1 ms five calls
    take and far below any network timeout, so a loaded machine cannot make it flaky."""
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
        # Chosen over the count topics create gives: where the key goes once it is known.
        assert record.partition == partitioners.keyed_partition(
            partitioners.DEFAULT, record.key, ASSUMED
        )
    assert broker.sent[-1].partition == named_partition(exact)


def test_a_burst_right_after_construction_goes_out_whole_and_in_order(monkeypatch):
    """What broke the first version under load: tens of thousands of records sent the
    moment the producer is made, while its first metadata answer is on its way. Each
    must go out, in the order sent, by the time flush() returns (that version left
    most of them held until message.timeout.ms: a count read between a send looking it
    up and holding its record never released it)."""
    broker = DownBroker(latency=0.02)
    broker.up()
    monkeypatch.setattr(producer_module, "Producer", lambda _config: broker)
    producer = _producer()
    total = 30_000
    mids = [
        producer.produce("orders", str(i).encode(), str(i % 7).encode(), delay=1)
        for i in range(total)
    ]
    assert producer.flush(10) == 0
    assert len(broker.sent) == total
    assert [int(r.value) for r in broker.sent] == list(range(total))
    assert [r.partition for r in broker.sent] == [level_place(m).partition for m in mids]  # type: ignore[union-attr]


def test_a_count_read_between_looking_it_up_and_holding_the_record_is_not_missed():
    """The lost wake-up, step by step: the sender saw no count; the reader then stored
    it and found nothing to release; the record must not wait for a release that
    already happened."""
    sent: list[bytes] = []
    counts: dict[str, int] = {}
    held = HeldSends(lambda topic, value, key, **kw: sent.append(value), counts.get, {})
    counts["lv-1"] = 3  # read after the sender looked
    held.release("lv-1", 3, None)  # nothing waits yet
    held.send(Held("lv-1", 0, b"1", b"k", [], {}, time.monotonic()), None)
    assert sent == [b"1"]
    assert len(held) == 0


def test_a_record_sent_once_the_count_is_known_goes_out_behind_those_held_before_it():
    """A key's records keep their order: whoever finds the count known first sends
    what waits, then its own."""
    sent: list[bytes] = []
    counts: dict[str, int] = {}
    held = HeldSends(lambda topic, value, key, **kw: sent.append(value), counts.get, {})
    now = time.monotonic()
    held.send(Held("lv-1", 0, b"1", b"k", [], {}, now), None)
    held.send(Held("lv-1", 0, b"2", b"k", [], {}, now), None)
    held.send(Held("lv-2", 0, b"other", b"k", [], {}, now), 3)
    assert sent == [b"other"]
    counts["lv-1"] = 3
    held.send(Held("lv-1", 0, b"3", b"k", [], {}, now), 3)
    assert sent == [b"other", b"1", b"2", b"3"]
    assert len(held) == 0


def test_a_full_librdkafka_queue_stops_the_drain_and_refuses_the_next_send():
    """As librdkafka's produce() raises BufferError: the rest go out, in order, once
    poll() has made room."""
    sent: list[bytes] = []
    room = {"left": 1}

    def produce(topic: str, value: bytes, key: bytes, **kw: Any) -> None:
        if room["left"] == 0:
            raise BufferError("Local: Queue full")
        room["left"] -= 1
        sent.append(value)

    counts: dict[str, int] = {}
    held = HeldSends(produce, counts.get, {})
    now = time.monotonic()
    for value in (b"1", b"2", b"3"):
        held.send(Held("lv-1", 0, value, b"k", [], {}, now), None)
    counts["lv-1"] = 3
    with pytest.raises(BufferError):
        held.send(Held("lv-1", 0, b"4", b"k", [], {}, now), 3)
    assert sent == [b"1"]
    room["left"] = 10
    held.serve()
    held.send(Held("lv-1", 0, b"4", b"k", [], {}, now), 3)
    assert sent == [b"1", b"2", b"3", b"4"]


def test_a_record_held_after_a_failed_read_goes_out_when_the_broker_is_back(monkeypatch):
    """The reads ahead failed before anything waited (so none was set to retry), the
    record came within the retry interval: flush() alone must ask again."""
    broker = DownBroker(refused=True)
    monkeypatch.setattr(producer_module, "Producer", lambda _config: broker)
    producer = _producer()
    deadline = time.monotonic() + 10
    while "lv-2" not in producer._partitions.failures:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    producer.produce("orders", b"v", b"k", delay=2)
    broker.up()
    assert producer.flush(5) == 0
    assert [r.topic for r in broker.sent] == ["lv-2"]


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
    producer.close()
    took = time.monotonic() - started
    assert took < 2, f"flush(0.2) and close() took {took:.1f} s"
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


def test_an_exact_marker_never_overtakes_the_held_message_it_names(broker):
    producer = _producer()
    mid = producer.produce("orders", b"v", delay=2, precision="exact")
    producer.cancel(mid)
    assert broker.sent == []
    broker.up()
    assert producer.flush(10) == 0
    message, marker = broker.sent
    assert (message.value, marker.value) == (b"v", None)
    assert marker.partition == message.partition == named_partition(mid)


def test_a_marker_naming_its_partition_goes_out_at_once_when_nothing_waits_before_it(broker):
    """It needs no count: only what waits for its topic may hold it back."""
    mid, partition = precise_id(5, far=False)
    _producer().cancel(mid)
    (marker,) = broker.sent
    assert (marker.topic, marker.partition) == ("timers", partition)


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


def test_a_refresh_happens_off_the_calling_thread_with_the_stale_count_used_meanwhile(broker):
    broker.up()
    partitions = TopicPartitions(broker)
    partitions.read_ahead(["t"])
    deadline = time.monotonic() + 10
    while partitions.peek("t") is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    broker.down.set()  # the refresh now waits its whole timeout
    broker.partitions = 9
    partitions._counts["t"] = (ASSUMED, time.monotonic())  # due for its refresh
    started = time.perf_counter()
    assert partitions.known("t") == ASSUMED
    assert time.perf_counter() - started < 0.05
    broker.up()
    while partitions.peek("t") != 9:
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_topic_partitions_never_asks_the_broker_from_known(broker):
    partitions = TopicPartitions(broker)
    started = time.perf_counter()
    assert partitions.known("t") is None
    assert time.perf_counter() - started < 0.05


@pytest.mark.parametrize("precision", ["level", "exact"])
def test_with_no_broker_at_all_produce_returns_in_milliseconds_and_the_callback_says_why(
    precision,
):
    """librdkafka itself, pointed at a port nothing listens on: every produce() returns
    within a few milliseconds (it took 10 s and raised), and the delivery callback
    reports the failure once message.timeout.ms has passed."""
    producer = DelayProducer(
        {"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 1000},
        settings=_settings(partitions=ASSUMED),
    )
    reports: list[Any] = []
    slowest = 0.0
    for i in range(20):
        started = time.perf_counter()
        producer.produce(
            "orders",
            b"v",
            f"k{i}".encode(),
            delay=2,
            precision=precision,
            on_delivery=lambda err, msg: reports.append(err),
        )
        slowest = max(slowest, time.perf_counter() - started)
    assert slowest < 0.02, f"the slowest produce() took {slowest * 1000:.1f} ms"
    started = time.monotonic()
    assert producer.flush(10) == 0
    assert time.monotonic() - started < 5
    assert len(reports) == 20
    assert {e.code() for e in reports} == {KafkaError._MSG_TIMED_OUT}
    producer.close()


def test_an_async_send_with_no_broker_fails_through_its_future_once_the_timeout_passes():
    """`AsyncDelayProducer.produce()` hands the record over on the loop's own thread
    (there is nothing to wait for), and its future fails as librdkafka reports it."""
    import asyncio

    from delayservice.async_producer import AsyncDelayProducer
    from delayservice.errors import DelayServiceError

    async def main() -> tuple[float, DelayServiceError]:
        producer = AsyncDelayProducer(
            {"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 1000},
            settings=_settings(partitions=ASSUMED),
        )
        started = time.monotonic()
        try:
            with pytest.raises(DelayServiceError) as caught:
                await asyncio.wait_for(producer.produce("orders", b"v", b"k", delay=2), 10)
            return time.monotonic() - started, caught.value
        finally:
            await producer._close(1)
            producer.producer.close()

    took, error = asyncio.run(main())
    assert error.code == KafkaError._MSG_TIMED_OUT
    assert took < 5, f"failed after {took:.1f} s"


def test_a_record_placed_before_a_smaller_count_came_fails_even_when_nothing_waits():
    """The count came between the send looking it up and taking the lock: the record was
    placed over `partitions` on one the topic lacks, and fails as a held one would."""
    sent: list[bytes] = []
    reports: list[Any] = []
    held = HeldSends(lambda topic, value, key, **kw: sent.append(value), {"lv-1": 1}.get, {})
    callback = {"on_delivery": lambda err, msg: reports.append(err)}
    held.send(Held("lv-1", 2, b"1", b"k", [], callback, time.monotonic()), None)
    assert sent == []
    assert held.serve() == 1
    assert [e.code() for e in reports] == [KafkaError._UNKNOWN_PARTITION]


def test_close_waits_for_a_count_read_in_flight_before_closing_librdkafka(
    monkeypatch: pytest.MonkeyPatch,
):
    """librdkafka's handle must not be destroyed under a metadata call another thread
    makes on it (a read ahead, with no broker answering, lasts up to its timeout): the
    producer closes only once the read has ended."""

    class Tracked(DownBroker):
        def __init__(self) -> None:
            super().__init__()
            self.in_flight = 0
            self.closed_in_flight: list[int] = []

        def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
            self.in_flight += 1
            try:
                return super().list_topics(topic, timeout)
            finally:
                self.in_flight -= 1

        def close(self) -> bool:
            self.closed_in_flight.append(self.in_flight)
            return super().close()

    tracked = Tracked()
    monkeypatch.setattr(producer_module, "Producer", lambda _config: tracked)
    producer = _producer()
    deadline = time.monotonic() + 5
    while not tracked.in_flight and time.monotonic() < deadline:
        time.sleep(0.005)
    assert tracked.in_flight, "a count read ahead is in flight"
    producer.close()
    assert tracked.closed_in_flight == [0]


def test_a_bare_kafka_error_from_a_read_ahead_leaves_the_next_read_free_to_start(
    monkeypatch: pytest.MonkeyPatch,
):
    """confluent-kafka can leave a bare `KafkaError` (no exception class) as the error
    of a call: the read-ahead thread it ends must not leave counts unread for good."""
    from delayservice.markers import topic_partitions as module
    from tests.level.fakes import raise_bare_kafka_error

    class Flaky(FakeProducer):
        calls = 0

        def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise_bare_kafka_error(KafkaError(KafkaError._TRANSPORT, "bare"))
            return super().list_topics(topic, timeout)

    def inline(target: Any) -> None:
        try:  # noqa: SIM105  # suppress(BaseException) lets a bare KafkaError through
            target()
        except:  # noqa: E722  # the thread ends on it, as a bare error ends a thread
            pass

    monkeypatch.setattr(module, "spawn", inline)
    counts = TopicPartitions(Flaky())
    counts.read_ahead(("lv-2",))
    assert counts.peek("lv-2") is None
    counts.read_ahead(("lv-2",))
    assert counts.peek("lv-2") is not None
