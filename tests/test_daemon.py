"""The daemon on a real broker: the invariants of ../shared/DESIGN.md, one test each."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest
from confluent_kafka import Producer

from delayservice import partitioners
from delayservice.envelope import Envelope, new_id, wrap
from delayservice.producer import DelayProducer

pytestmark = pytest.mark.kafka


@pytest.fixture(params=["at-least-once", "exactly-once"])
def guarantee(request) -> str:
    """Every daemon test that takes this runs under both guarantees."""
    return request.param


@pytest.fixture(autouse=True, params=["shared", pytest.param("per-level", marks=pytest.mark.long)])
def layout(request, testbed) -> str:
    """Every daemon test runs with one worker for all levels (the default) and, with
    --all, with one worker per level."""
    testbed.level_workers = request.param
    return request.param


def _headers(message) -> dict[str, bytes]:
    return dict(message.headers() or [])


def test_delivery_at_three_levels_is_never_early_and_within_the_level_policy(testbed, guarantee):
    settings = testbed.settings(guarantee=guarantee)
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(f"orders-{testbed.tag}")
    daemon = testbed.start_daemon(settings)
    testbed.wait_assigned(daemon, partitions=settings.partitions)

    producer = testbed.producer(settings)
    requested = {}  # id -> (requested delay s, level delay s, send time ms)
    for i, delay in enumerate([0.3, 1.0, 1.5, 2.0, 2.5, 3.0] * 5):
        level_s = {0.3: 1, 1.0: 1, 1.5: 2, 2.0: 2, 2.5: 3, 3.0: 3}[delay]
        sent_ms = time.time() * 1000
        mid = producer.produce(target, f"v{i}".encode(), key=f"k{i}".encode(), delay=delay)
        requested[mid] = (delay, level_s, sent_ms)
    assert producer.flush(10) == 0

    records = testbed.collect(target, len(requested), timeout=30)
    seen_levels = set()
    for record in records:
        headers = _headers(record)
        mid = headers["delay-id"].decode()
        due_ms = int(headers["delay-due-ms"])
        delay, level_s, sent_ms = requested[mid]
        forwarded_ms = record.timestamp()[1]
        assert forwarded_ms >= due_ms, f"{mid} forwarded {due_ms - forwarded_ms} ms early"
        # Level policy: due = append time + the level's delay, so never before send + level.
        assert due_ms >= sent_ms + level_s * 1000 - 5
        assert due_ms >= sent_ms + delay * 1000 - 5
        # Lateness stays small once the daemon owns its partitions (generous for a shared CI box).
        assert forwarded_ms - due_ms < 1500
        seen_levels.add(level_s)
    assert seen_levels == {1, 2, 3}
    assert sorted(_headers(r)["delay-id"].decode() for r in records) == sorted(requested)
    sample = daemon.registry.get_sample_value

    def lateness_count() -> float:
        levels = ("1s", "2s", "3s")
        return sum(sample("delayservice_lateness_seconds_count", {"level": lv}) for lv in levels)

    testbed.wait_for(lambda: lateness_count() == len(requested), 10, "one lateness sample each")
    assert sample("delayservice_dead_lettered_total", {"level": "3s", "reason": "too_large"}) == 0
    # The broker's acknowledgements carry offsets: nothing was sent twice as unconfirmed.
    for lv in ("1s", "2s", "3s"):
        labels = {"level": lv, "error": "unconfirmed_ack"}
        assert not sample("delayservice_forward_errors_total", labels)


def test_a_message_without_delay_goes_straight_to_its_topic(testbed):
    settings = testbed.settings()
    target = testbed.create_topic(f"now-{testbed.tag}")
    producer = testbed.producer(settings)
    producer.produce(target, b"now", delay=0)
    producer.flush(10)
    (record,) = testbed.collect(target, 1, timeout=20)
    assert record.value() == b"now"
    assert "delay-id" not in _headers(record)


def test_key_order_is_kept_within_a_level(testbed, guarantee):
    settings = testbed.settings(levels="1s", guarantee=guarantee)
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(f"ordered-{testbed.tag}", partitions=3)
    daemon = testbed.start_daemon(settings)
    testbed.wait_assigned(daemon, partitions=settings.partitions)
    producer = testbed.producer(settings)
    for seq in range(300):
        producer.produce(target, str(seq).encode(), key=f"key-{seq % 7}".encode(), delay=1)
    producer.flush(10)
    per_key = defaultdict(list)
    for record in testbed.collect(target, 300, timeout=30):
        per_key[record.key()].append(int(record.value()))
    assert len(per_key) == 7
    for key, values in per_key.items():
        assert values == sorted(values), f"{key!r} out of order"


@pytest.mark.long  # 60 s a run; flow control's pause and resume are CI's in tests/level
@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_a_backlog_drains_without_the_buffer_exceeding_the_pause_threshold(testbed, guarantee):
    total, high = 50_000, 200
    settings = testbed.settings(
        levels="1s", pause_high_water=high, pause_low_water=50, guarantee=guarantee
    )
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(f"backlog-{testbed.tag}")
    producer = testbed.producer(settings)
    payload = b"x" * 100
    for i in range(total):
        producer.produce(target, payload, key=str(i % 1000).encode(), delay=1)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    daemon = testbed.start_daemon(settings)
    testbed.collect(target, total, timeout=240)
    worker = daemon.workers[0]
    testbed.wait_for(lambda: worker.group.total_buffered == 0, 30, "the buffer to empty")
    assert 0 < worker.group.peak_partition_buffered <= high
    assert worker.loop.paused == set()


def test_two_daemons_share_the_partitions_and_stopping_one_loses_nothing(testbed, guarantee):
    settings = testbed.settings(levels="1s,2s", partitions=4, guarantee=guarantee)
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(f"shared-{testbed.tag}")
    first, second = testbed.start_daemon(settings), testbed.start_daemon(settings)
    testbed.wait_assigned(first, second, partitions=4)
    testbed.wait_for(
        lambda: all(w.loop.owned_partitions for d in (first, second) for w in d.workers),
        60,
        "both daemons to own a share of the level partitions",
    )
    testbed.wait_assigned(first, second, partitions=4)

    producer = testbed.producer(settings)
    ids = set()
    for i in range(400):
        ids.add(producer.produce(target, f"m{i}".encode(), key=f"k{i}".encode(), delay=1 + i % 2))
        if i == 200:
            producer.flush(10)
            assert first.stop() == 0  # mid-stream: the second takes over
    producer.flush(10)
    testbed.wait_assigned(second, partitions=4)
    delivered = {
        _headers(r)["delay-id"].decode() for r in testbed.collect(target, len(ids), timeout=60)
    }
    assert ids <= delivered


def test_forwarded_messages_land_where_a_java_client_would_put_them(
    testbed, java_partitions, guarantee
):
    """Records from a producer that hashes like Java's: the SDK set to `murmur2_random`,
    and a producer that writes no `delay-partitioner` at all (a Java application's, or
    any other that speaks the envelope without it)."""
    settings = testbed.settings(levels="1s", guarantee=guarantee)
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(f"partitioned-{testbed.tag}", partitions=7)
    daemon = testbed.start_daemon(settings)
    testbed.wait_assigned(daemon, partitions=settings.partitions)
    keys = [f"customer-{i}" for i in range(100)] + ["", "ü-ñ", "x" * 300]
    expected = java_partitions(keys, 7)
    level = next(iter(settings.level_set()))
    sdk = DelayProducer(
        {"bootstrap.servers": testbed.bootstrap, "partitioner": "murmur2_random"},
        settings=settings,
    )
    plain = Producer({"bootstrap.servers": testbed.bootstrap})
    for index, key in enumerate(keys):
        if index % 2:
            sdk.produce(target, b"v", key=key.encode(), delay=1)
        else:
            envelope = Envelope(target, level.delay_ms, new_id())  # no delay-partitioner
            plain.produce(level.topic, b"v", key.encode(), headers=wrap(envelope, None))
    sdk.produce(target, b"pinned", key=b"customer-1", partition=5, delay=1)
    assert sdk.flush(10) == 0
    assert plain.flush(10) == 0
    records = testbed.collect(target, len(keys) + 1, timeout=30)
    for record in records:
        if record.value() == b"pinned":
            assert record.partition() == 5
        else:
            key = record.key().decode()
            assert record.partition() == expected[key], key


DETERMINISTIC = sorted(partitioners.NAMES - {"random"})


def test_a_delayed_record_lands_where_an_undelayed_one_from_the_same_producer_does(testbed):
    """For each librdkafka partitioner: keys sent undelayed through a plain confluent
    `Producer` land on some partitions (librdkafka's own placement, from its delivery
    reports); the same keys sent delayed through `DelayProducer` with the same
    `partitioner` are forwarded by the daemon to exactly the same ones."""
    settings = testbed.settings(levels="1s")
    testbed.create_delay_topics(settings)
    daemon = testbed.start_daemon(settings)
    testbed.wait_assigned(daemon, partitions=settings.partitions)
    keys = [f"order-{i}".encode() for i in range(60)] + [b"\xff\x00", "ü".encode() * 40]
    for name in DETERMINISTIC:
        target = testbed.create_topic(f"by-{name}-{testbed.tag}", partitions=6)
        undelayed: dict[bytes, int] = {}

        def placed(error, message, found=undelayed):
            assert error is None, error
            found[message.key()] = message.partition()

        direct = Producer({"bootstrap.servers": testbed.bootstrap, "partitioner": name})
        for key in [*keys, b""] if name != "consistent_random" else keys:  # b"": sticky there
            direct.produce(target, b"now", key, on_delivery=placed)
        assert direct.flush(10) == 0
        delayed = DelayProducer(
            {"bootstrap.servers": testbed.bootstrap, "partitioner": name}, settings=settings
        )
        for key in undelayed:
            delayed.produce(target, b"later", key=key, delay=1)
        assert delayed.flush(10) == 0
        records = testbed.collect(target, 2 * len(undelayed), timeout=30)
        forwarded = {r.key(): r.partition() for r in records if r.value() == b"later"}
        assert forwarded == undelayed, name
        assert len(set(undelayed.values())) > 1, f"{name}: every key on one partition"


def test_readiness_waits_for_the_first_assignment_and_names_what_each_level_owns(testbed):
    settings = testbed.settings(levels="1s,2s", partitions=1)
    testbed.create_delay_topics(settings)
    first = testbed.start_daemon(settings)
    assert not first.readiness()[0]  # subscribed, not yet assigned
    testbed.wait_for(lambda: first.readiness()[0], 60, "the first daemon to be ready")
    assert f"{settings.topic_prefix}1: owns 0" in first.readiness()[1]
    second = testbed.start_daemon(settings)  # one partition per level: nothing left for it
    testbed.wait_for(lambda: second.readiness()[0], 60, "the second daemon to be ready")
    assert "owns no partitions" in second.readiness()[1]
    assert "owns 0" in first.readiness()[1]


def test_readiness_turns_red_when_nothing_is_forwarded_for_the_retry_budget(testbed, guarantee):
    """A daemon whose producer never reaches a broker (its consumer does) has records
    due and sends nothing: after `retry_give_up_s` /readyz says so, under either
    guarantee (exactly-once: its transactions cannot even start)."""
    stranded = testbed.settings(
        levels="1s",
        partitions=1,
        guarantee=guarantee,
        producer={"bootstrap.servers": "127.0.0.1:1"},
        retry_give_up_s=3,
        shutdown_timeout_s=5,
    )
    testbed.create_delay_topics(stranded)
    daemon = testbed.start_daemon(stranded)
    testbed.wait_for(lambda: daemon.readiness()[0], 60, "the stranded daemon to be assigned")
    target = testbed.create_topic(f"stalled-{testbed.tag}", partitions=1)
    producer = testbed.producer(stranded)
    producer.produce(target, b"due", delay=1)
    assert producer.flush(10) == 0
    testbed.wait_for(lambda: not daemon.readiness()[0], 60, "readiness to turn red")
    why = daemon.readiness()[1]
    assert "nothing forwarded for" in why, why
    assert "while records are due" in why, why


def test_a_backlog_parked_in_one_level_never_stops_forwarding_of_another(testbed):
    """One consumer reads every level: the long level's backlog (not due for hours)
    fills its partitions to the mark, which pauses them alone, and the short level's
    records keep arriving, every one, none early."""
    settings = testbed.settings(levels="1s,2h", pause_high_water=1_000, pause_low_water=500)
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(f"isolation-{testbed.tag}")
    producer = testbed.producer(settings)
    for i in range(10_000):
        producer.produce(target, b"parked", key=str(i).encode(), delay=7_200)
        if i % 5_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    daemon = testbed.start_daemon(settings)
    short, long_ = (level.topic for level in settings.level_set())

    def paused() -> set[tuple[str, int]]:
        return {tp for worker in daemon.workers for tp in worker.loop.paused}

    testbed.wait_for(
        lambda: (
            {tp for tp in paused() if tp[0] == long_}
            == {(long_, p) for p in range(settings.partitions)}
        ),
        60,
        "every partition of the long level to be paused near its mark",
    )
    sent = {producer.produce(target, f"m{i}".encode(), delay=1) for i in range(300)}
    assert producer.flush(10) == 0
    arrived = testbed.collect(target, len(sent), timeout=60)
    by_id = {_headers(r)["delay-id"].decode(): r for r in arrived}
    assert set(by_id) == sent
    for record in arrived:
        assert record.timestamp()[1] >= int(_headers(record)["delay-due-ms"])
    assert not any(tp[0] == short for tp in paused())
