"""DelayProducer in exact precision and cancel, against a fake wrapped producer."""

from __future__ import annotations

import math
import time
import zlib
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaError, KafkaException

from delayservice import producer as producer_module
from delayservice.errors import ConfigError, DelayServiceError, DelayTooLongError, EnvelopeError
from delayservice.levels import LevelSet
from delayservice.markers import topic_partitions
from delayservice.markers.precise_ids import named_partition, precise_partition
from delayservice.producer import DelayProducer
from delayservice.settings_loading import load_settings

PRECISE = "timers"
PARTITIONS = 5


class FakeProducer:
    """Records what is produced and answers metadata for the precise topic."""

    def __init__(self) -> None:
        self.sent: list[SimpleNamespace] = []
        self.metadata_calls = 0
        self.partitions = PARTITIONS
        self.failure: Exception | None = None
        self.topic_error: KafkaError | None = None

    def produce(self, topic: str, value: Any = None, key: Any = None, **kwargs: Any) -> None:
        self.sent.append(SimpleNamespace(topic=topic, value=value, key=key, **kwargs))

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self.metadata_calls += 1
        if self.failure is not None:
            raise self.failure
        if self.topic_error is not None:
            info = SimpleNamespace(error=self.topic_error, partitions={})
        else:
            info = SimpleNamespace(error=None, partitions=dict.fromkeys(range(self.partitions)))
        return SimpleNamespace(topics={topic: info})

    def flush(self, timeout: float = -1) -> int:
        return 0

    def poll(self, timeout: float = -1) -> int:
        return 0

    def __len__(self) -> int:
        return len(self.sent)


@pytest.fixture
def fake(monkeypatch):
    wrapped = FakeProducer()
    monkeypatch.setattr(producer_module, "Producer", lambda _config: wrapped)
    in_line(monkeypatch)
    return wrapped


def in_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Partition counts are read ahead in line, so these tests see each answer at once."""
    monkeypatch.setattr(topic_partitions, "spawn", lambda target: target())
    monkeypatch.setattr(topic_partitions, "RETRY_S", 0.0)
    monkeypatch.setattr(topic_partitions, "later", lambda _delay, _target: None)


def _settings(**overrides: Any) -> Any:
    """Everything goes to the near precise topic unless `precise_far_after` is given."""
    values = {
        "levels": "1s,2s",
        "topic_prefix": "lv-",
        "precise_topic": PRECISE,
        "precise_far_after": "400d",
        **overrides,
    }
    return load_settings(**values)


def _producer(precision: Any = "exact", **overrides: Any) -> DelayProducer:
    return DelayProducer({}, settings=_settings(**overrides), precision=precision)


def _landed(record: SimpleNamespace, offset: int = 7) -> Any:
    """The delivery report librdkafka gives for `record`: a message that says where."""
    return SimpleNamespace(
        topic=lambda: record.topic,
        partition=lambda: record.partition,
        offset=lambda: offset,
        timestamp=lambda: (TIMESTAMP_LOG_APPEND_TIME, int(time.time() * 1000)),
    )


def _envelope(record: SimpleNamespace) -> dict[str, Any]:
    return {name: value for name, value in record.headers if name.startswith("delay-")}


def test_an_exact_delay_goes_to_the_precise_topic_with_the_envelope(fake):
    producer = _producer()
    reports = []
    mid = producer.produce(
        "orders",
        b"v",
        b"k",
        2,
        on_delivery=lambda err, msg: reports.append(err),
        headers={"trace": "t"},
        delay=timedelta(minutes=90, microseconds=300),
    )
    (record,) = fake.sent
    assert record.topic == PRECISE
    assert record.partition == precise_partition(mid, PARTITIONS)
    assert (record.key, record.value) == (b"k", b"v")
    assert record.headers[0] == ("trace", "t")  # user headers first, untouched
    assert record.headers[1:] == [
        ("delay-v", b"1"),
        ("delay-target", b"orders"),
        ("delay-ms", b"5400001"),  # rounded up: never early
        ("delay-id", mid.encode()),
        ("delay-partition", b"2"),
    ]
    record.on_delivery(None, None)
    assert reports == [None]


@pytest.mark.parametrize("as_datetime", [True, False])
def test_an_exact_deliver_at_carries_its_due_time_and_no_delay(fake, as_datetime):
    at = datetime.now(UTC) + timedelta(hours=3, microseconds=700)
    mid = _producer().produce("orders", b"v", deliver_at=at if as_datetime else at.timestamp())
    (record,) = fake.sent
    assert record.topic == PRECISE
    envelope = _envelope(record)
    assert envelope["delay-ms"] == b"0"
    assert envelope["delay-due-ms"] == str(math.ceil(at.timestamp() * 1000)).encode()
    assert envelope["delay-id"] == mid.encode()
    assert "delay-partition" not in envelope


@pytest.mark.parametrize(
    "timing",
    [{"delay": 0}, {"delay": "0s"}, {"deliver_at": time.time() - 1}, {}],
    ids=["zero", "zero-string", "past", "none"],
)
def test_an_exact_message_with_no_wait_goes_straight_to_its_topic(fake, timing):
    producer = _producer()
    calls = fake.metadata_calls  # what was read ahead
    producer.produce("orders", b"v", b"k", 1, headers=[("h", b"1")], **timing)
    (record,) = fake.sent
    assert (record.topic, record.partition, record.headers) == ("orders", 1, [("h", b"1")])
    assert fake.metadata_calls == calls


def test_an_exact_delay_above_max_delay_is_refused_before_anything_is_sent(fake):
    producer = _producer(max_delay="1h")
    calls = fake.metadata_calls  # what was read ahead
    with pytest.raises(DelayTooLongError, match=r"max_delay \(1h\)"):
        producer.produce("orders", b"v", delay=3600.001)
    with pytest.raises(DelayTooLongError, match=r"max_delay \(1h\)"):
        producer.produce("orders", b"v", deliver_at=time.time() + 3601)
    assert fake.sent == []
    assert fake.metadata_calls == calls
    producer.produce("orders", b"v", delay=3600)  # the max itself is fine
    assert len(fake.sent) == 1


def test_levels_above_the_top_level_still_fit_an_exact_producer(fake):
    """Exact messages are bounded by max_delay, not by the level set."""
    _producer().produce("orders", b"v", delay=timedelta(days=6))
    assert fake.sent[0].topic == PRECISE


def test_precision_can_be_chosen_per_message(fake):
    level_producer = _producer(precision="level")
    level_producer.produce("orders", b"a", delay=1.5)
    level_producer.produce("orders", b"b", delay=1.5, precision="exact")
    exact_producer = _producer()
    exact_producer.produce("orders", b"c", delay=1.5, precision="level")
    exact_producer.produce("orders", b"d", delay=1.5)
    assert [(r.topic, r.value) for r in fake.sent] == [
        ("lv-2", b"a"),
        (PRECISE, b"b"),
        ("lv-2", b"c"),
        (PRECISE, b"d"),
    ]


def test_an_unknown_precision_is_refused(fake):
    with pytest.raises(ValueError, match="precision must be one of"):
        _producer(precision="roughly")
    with pytest.raises(ValueError, match="precision must be one of"):
        _producer().produce("orders", b"v", delay=1, precision="roughly")
    assert fake.sent == []


def test_reserved_user_headers_are_refused_in_exact_mode_too(fake):
    with pytest.raises(EnvelopeError, match="reserved prefix"):
        _producer().produce("orders", b"v", headers=[("delay-ms", b"1")], delay=5)
    assert fake.sent == []


def test_the_partition_count_is_asked_once_per_producer(fake):
    producer = _producer()
    calls = fake.metadata_calls  # read ahead: the level topics, the precise ones, the markers
    assert calls == 5
    ids = [producer.produce("orders", b"v", delay=10) for _ in range(20)]
    producer.cancel(ids[0])
    assert fake.metadata_calls == calls
    assert [r.partition for r in fake.sent[:20]] == [precise_partition(i, PARTITIONS) for i in ids]
    assert len({r.partition for r in fake.sent}) > 1


def test_a_missing_precise_topic_fails_through_the_callback_saying_how_to_create_it(fake):
    """As librdkafka fails a record it cannot route: produce() returns, the delivery
    callback says why at the next poll(), and the answer is not remembered."""
    fake.topic_error = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
    producer = _producer()
    reports: list[tuple[Any, Any]] = []
    producer.produce("orders", b"v", delay=10, on_delivery=lambda e, m: reports.append((e, m)))
    assert fake.sent == []
    assert producer.poll(0) == 1
    ((error, message),) = reports
    assert error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert "delayservice topics create" in error.str()
    assert PRECISE in error.str()
    assert (message.topic(), message.value()) == (PRECISE, b"v")
    assert len(producer) == 0
    fake.topic_error = None  # someone ran `topics create`: the next send works
    producer.produce("orders", b"v", delay=10)
    assert fake.sent[0].topic == PRECISE


def test_unreachable_metadata_is_a_retriable_error_naming_the_topic(fake):
    fake.failure = KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))
    producer = _producer(precise=True)  # an id of no known form goes to the precise topic
    with pytest.raises(DelayServiceError, match=f"partitions of {PRECISE}: broker down") as caught:
        producer.cancel("abc")
    assert caught.value.retriable
    assert caught.value.code == KafkaError._TRANSPORT
    assert fake.sent == []


@pytest.mark.parametrize("precision", ["level", "exact"])
def test_a_cancel_marker_goes_to_the_partition_of_its_message(fake, precision):
    producer = _producer(precision=precision)
    mid = producer.produce("orders", b"v", b"k", delay=30, precision="exact")
    reports = []
    producer.cancel(mid, on_delivery=lambda err, msg: reports.append(err))
    message, marker = fake.sent
    assert (marker.topic, marker.partition) == (PRECISE, message.partition)
    assert (marker.key, marker.value) == (None, None)
    assert marker.headers == [("delay-v", b"1"), ("delay-cancel", mid.encode())]
    marker.on_delivery(None, _landed(marker))
    assert reports == [None]


@pytest.mark.parametrize("bad", ["", None, b"abc", 42])
def test_a_cancel_needs_a_non_empty_string_id(fake, bad):
    producer = _producer()
    calls = fake.metadata_calls
    with pytest.raises(ValueError, match="non-empty string"):
        producer.cancel(bad)
    assert fake.sent == []
    assert fake.metadata_calls == calls


def test_a_level_producer_given_only_levels_reads_settings_only_when_it_needs_them(
    fake, monkeypatch
):
    """Today's `levels=` producers never read the environment; cancel and exact sends
    need the precise topic, so they load the settings then (and their errors show)."""
    monkeypatch.setenv("DELAYSERVICE_PRECISE_TOPIC", "from-env")
    monkeypatch.setenv("DELAYSERVICE_PRECISE", "true")  # an id of no known form goes there
    monkeypatch.setenv("DELAYSERVICE_PRECISE_MEMBER", "5")  # invalid: 1 member
    producer = DelayProducer({}, levels=LevelSet.parse("1s"))
    producer.produce("orders", b"v", delay=1)
    assert fake.sent[0].topic == "delay_topic_1"
    with pytest.raises(ConfigError, match="precise_member"):
        producer.cancel("abc")
    with pytest.raises(ConfigError, match="precise_member"):
        DelayProducer({}, levels=LevelSet.parse("1s"), precision="exact")
    monkeypatch.delenv("DELAYSERVICE_PRECISE_MEMBER")
    producer.cancel("abc")
    assert fake.sent[-1].topic == "from-env"


def test_an_exact_message_id_names_the_partition_it_was_sent_to(fake):
    producer = _producer()
    ids = [producer.produce("orders", b"v", delay=10) for _ in range(40)]
    for mid, record in zip(ids, fake.sent, strict=True):
        random_part, _, named = mid.partition("-p")
        assert len(random_part) == 32
        assert record.partition == int(named) == named_partition(mid)
    assert {r.partition for r in fake.sent} == set(range(PARTITIONS))


def test_a_cancel_after_the_topic_grew_still_goes_to_its_message(fake):
    """Both ways round: a producer that knows more partitions cancels a message sent
    when there were fewer, and one that knows fewer cancels a message sent to a
    partition added since. Neither needs the partition count to cancel."""
    before = _producer()
    old = [before.produce("orders", b"v", delay=60) for _ in range(30)]
    fake.partitions = 12
    after = _producer()
    new = [after.produce("orders", b"v", delay=60) for _ in range(60)]
    sent_to = {dict(r.headers)["delay-id"].decode(): r.partition for r in fake.sent}
    assert max(sent_to[mid] for mid in new) >= PARTITIONS  # new partitions are used
    calls = fake.metadata_calls
    for mid in old:
        after.cancel(mid)
    for mid in new:
        before.cancel(mid)
    markers = fake.sent[len(old) + len(new) :]
    assert [m.partition for m in markers] == [sent_to[mid] for mid in [*old, *new]]
    assert fake.metadata_calls == calls


def test_exact_sends_take_up_partitions_added_while_the_producer_runs(fake, monkeypatch):
    clock = {"now": 1000.0}
    monkeypatch.setattr(topic_partitions.time, "monotonic", lambda: clock["now"])
    producer = _producer()
    calls = fake.metadata_calls  # read ahead
    producer.produce("orders", b"v", delay=10)
    fake.partitions = 40
    clock["now"] += topic_partitions.REFRESH_S - 1
    for _ in range(50):
        producer.produce("orders", b"v", delay=10)
    assert max(r.partition for r in fake.sent) < PARTITIONS
    clock["now"] += 1
    for _ in range(200):
        producer.produce("orders", b"v", delay=10)
    assert max(r.partition for r in fake.sent) >= PARTITIONS
    assert fake.metadata_calls == calls + 1


def test_a_failed_refresh_keeps_the_known_count_and_sends_on(fake, monkeypatch):
    clock = {"now": 1000.0}
    monkeypatch.setattr(topic_partitions.time, "monotonic", lambda: clock["now"])
    producer = _producer()
    calls = fake.metadata_calls  # read ahead
    producer.produce("orders", b"v", delay=10)
    fake.failure = KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))
    clock["now"] += topic_partitions.REFRESH_S
    producer.produce("orders", b"v", delay=10)
    producer.produce("orders", b"v", delay=10)
    assert len(fake.sent) == 3
    assert fake.metadata_calls == calls + 1  # not asked again before the next interval


@pytest.mark.parametrize(
    "mid",
    ["abc", "0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef-p01", "x-p3"],
)
def test_an_id_that_names_no_partition_falls_back_to_crc32(fake, mid):
    assert named_partition(mid) is None
    _producer().cancel(mid)
    (marker,) = fake.sent
    assert (
        marker.partition
        == zlib.crc32(mid.encode()) % PARTITIONS
        == precise_partition(mid, PARTITIONS)
    )


def test_a_reschedule_marker_goes_to_the_partition_of_its_message(fake):
    producer = _producer()
    mid = producer.produce("orders", b"v", b"k", delay=30)
    reports = []
    producer.reschedule(mid, delay=timedelta(minutes=5), on_delivery=lambda e, m: reports.append(e))
    at = time.time() + 3600.25
    producer.reschedule(mid, deliver_at=at)
    producer.reschedule(mid, delay=0)  # now
    message, later, absolute, now = fake.sent
    for marker in (later, absolute, now):
        assert (marker.topic, marker.partition) == (PRECISE, message.partition)
        assert (marker.key, marker.value) == (None, None)
    assert later.headers == [
        ("delay-v", b"1"),
        ("delay-reschedule", mid.encode()),
        ("delay-ms", b"300000"),
    ]
    assert _envelope(absolute)["delay-due-ms"] == str(math.ceil(at * 1000)).encode()
    assert _envelope(absolute)["delay-ms"] == b"0"
    assert _envelope(now)["delay-ms"] == b"0"
    assert "delay-due-ms" not in _envelope(now)
    later.on_delivery(None, _landed(later))
    assert reports == [None]


def test_a_reschedule_needs_an_id_and_one_time_within_max_delay(fake):
    producer = _producer(max_delay="1d")
    with pytest.raises(ValueError, match="non-empty string"):
        producer.reschedule("", delay=5)
    with pytest.raises(ValueError, match="delay= or deliver_at="):
        producer.reschedule("abc")
    with pytest.raises(ValueError, match="not both"):
        producer.reschedule("abc", delay=5, deliver_at=time.time() + 10)
    with pytest.raises(DelayTooLongError):
        producer.reschedule("abc", delay=timedelta(days=2))
    assert fake.sent == []


def test_delays_beyond_precise_far_after_go_to_the_far_topic_and_their_ids_say_so(fake):
    producer = _producer(precise_far_after="1h")
    near = producer.produce("orders", b"v", delay=timedelta(minutes=59))
    far = producer.produce("orders", b"v", delay=timedelta(minutes=61))
    far_at = producer.produce("orders", b"v", deliver_at=time.time() + 2 * 3600)
    near_record, far_record, at_record = fake.sent
    assert near_record.topic == PRECISE
    assert named_partition(near) == near_record.partition
    assert {far_record.topic, at_record.topic} == {f"{PRECISE}_far"}
    assert named_partition(far) is None  # it names no partition of the near topic
    assert named_partition(far, far=True) == far_record.partition
    assert named_partition(far_at, far=True) == at_record.partition
    assert far.endswith(f"-f{far_record.partition}")


def test_markers_of_a_far_message_go_to_its_far_partition(fake):
    producer = _producer(precise_far_after="1h")
    far = producer.produce("orders", b"v", delay=timedelta(days=3))
    producer.cancel(far)
    producer.reschedule(far, delay=5)
    message, cancel, move = fake.sent
    assert {(r.topic, r.partition) for r in (cancel, move)} == {(message.topic, message.partition)}
    assert message.topic == f"{PRECISE}_far"
