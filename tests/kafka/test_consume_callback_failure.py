"""What a consumer does with the batch it fetched when a callback fails inside
`consume()`, on a real broker: confluent-kafka destroys the batch (`Consumer_consume`
returns NULL once `CallState_end` finds the crash), and the client has moved past it.
The fake consumer of the simulations drops the batch the same way for a broken shape
from `consume()` (`tests/simulation.py`, `_after_its_work`), and both the level consumer
loop and the precise intake seek every partition back after a failed iteration: the
daemon's rows below fail a log line on its consumer's thread now and then under traffic,
in both modes and under both guarantees (with `ClientLines`' guard on log lines taken
away), and judge what arrived. With those seeks undone each row lost one or two
records of 3,000. The last row keeps the guard: the same lines then cost nothing."""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from delayservice.daemon import EXIT_OK
from delayservice.kafka.client_config import LIBRDKAFKA_LOGGER
from delayservice.kafka.client_lines import ClientLines
from tests.faults.failing_lines.failing_filter import FailingFilter, install, rearm

pytestmark = pytest.mark.kafka

ATTEMPTS = 20
"""A callback fails only where a log line stands in the queue among the records: some
calls meet none, some meet one before any record."""


CLOSE_WAIT_S = 10.0
MESSAGES = 3_000


class _FailingLogger:
    """A logger whose next line raises, as a logging filter that fails would."""

    def __init__(self) -> None:
        self.armed = False

    def log(self, *_args: Any, **_kwargs: Any) -> None:
        if self.armed:
            self.armed = False
            raise RuntimeError("a logging filter failed")


def test_a_callback_failing_inside_consume_drops_the_records_it_fetched(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("dropped")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(2_000):
        producer.produce(topic, b"%d" % i)
    assert producer.flush(30) == 0
    logger = _FailingLogger()
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": unique_name("dropping"),
            "enable.auto.commit": False,
            "logger": logger,
            "debug": "fetch",  # log lines among the fetched records
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    skipped: list[tuple[int, int]] = []
    try:
        for _ in range(ATTEMPTS):
            (last,) = consumer.consume(1, 10)
            time.sleep(0.5)  # records and log lines queue up
            logger.armed = True
            try:
                consumer.consume(500, 2)
            except RuntimeError:
                (after,) = consumer.consume(1, 10)
                if after.offset() > (last.offset() or 0) + 1:
                    skipped.append((last.offset() or 0, after.offset() or 0))
                    break
            logger.armed = False
            consumer.seek(TopicPartition(topic, 0, 0))
    finally:
        logger.armed = False
        # After a crashed consume() this client's close() was seen to hang: it is left
        # to a thread of its own, not waited for past a while.
        closing = threading.Thread(target=consumer.close, daemon=True)
        closing.start()
        closing.join(CLOSE_WAIT_S)
    assert skipped, f"no consume() in {ATTEMPTS} dropped what it fetched"


@contextlib.contextmanager
def _failing_consumer_lines(thread_prefix: str, start: threading.Event) -> Iterator[FailingFilter]:
    """librdkafka's lines through a failing filter (the clients are told `debug=fetch`),
    re-armed every `REARM_S` once `start` is set: the assignment's own offset fetches
    must not fail, or nothing is ever assigned."""
    failing = FailingFilter(thread_prefix)
    restore = install(logging.getLogger(LIBRDKAFKA_LOGGER), failing)
    stop = threading.Event()

    def arm() -> None:
        start.wait()
        rearm(failing, stop)

    arming = threading.Thread(target=arm, name="arming", daemon=True)
    arming.start()
    try:
        yield failing
    finally:
        stop.set()
        start.set()
        arming.join()
        restore()


def _headers(message: Any) -> dict[str, bytes]:
    return dict(message.headers() or [])


@pytest.mark.parametrize(
    ("mode", "guarantee"),
    [
        ("level", "at-least-once"),
        ("level", "exactly-once"),
        ("precise", "at-least-once"),
        ("precise", "exactly-once"),
    ],
)
def test_a_daemon_whose_consume_drops_what_it_fetched_loses_nothing(
    testbed: Any, tmp_path: Path, mode: str, guarantee: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's answer to the client above: after every failed consume() the level
    consumer loop seeks its partitions back to after the last record it admitted, and
    the precise intake to after what it handled, so every record arrives, none early,
    and under exactly-once (read read_committed) once. Without those seeks the dropped
    records were committed past (level) or never read (precise).

    The daemon's clients log through `ClientLines`, which keeps a failing line out of
    the client's call (the row below); here that guard is taken away, so the failing
    line stands for any callback that fails inside consume()."""
    monkeypatch.setattr(ClientLines, "log", ClientLines._line)
    failing, sent, records, _ = _run_with_failing_lines(testbed, tmp_path, mode, guarantee)
    assert failing.raised >= 4, f"only {failing.raised} lines failed on the consumer's thread"
    _judge(sent, records, guarantee)


def test_a_log_line_that_fails_costs_the_line_not_the_batch(
    testbed: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With `ClientLines` in place the same failing lines never reach the client's
    call: no consumer turn fails, every record arrives, and the client is closed
    (after a failed consume() librdkafka could not destroy it, and the stop ran out its
    timeout: docs/faults.md, row 33)."""
    caplog.set_level(logging.ERROR, logger="delayservice.kafka.consumer_thread")
    failing, sent, records, daemon = _run_with_failing_lines(
        testbed, tmp_path, "level", "at-least-once"
    )
    assert failing.raised >= 4, f"only {failing.raised} lines failed on the consumer's thread"
    failed_turns = [r for r in caplog.records if "a logging filter failed" in r.getMessage()]
    assert failed_turns == [], f"{len(failed_turns)} consumer turns failed"
    _judge(sent, records, "at-least-once")
    assert daemon.stop() == EXIT_OK, "the daemon did not stop cleanly"


def _run_with_failing_lines(
    testbed: Any, tmp_path: Path, mode: str, guarantee: str
) -> tuple[FailingFilter, set[str], list[Any], Any]:
    """A daemon with librdkafka's lines failing on its consumer's thread now and then,
    under waves of traffic: the filter, the ids sent, what arrived, and the daemon
    (the lines fail no more)."""
    precise = mode == "precise"
    values: dict[str, Any] = {
        "levels": "1s,2s",
        "guarantee": guarantee,
        "consumer": {"debug": "fetch"},
    }
    if precise:
        values.update(
            precise=True,
            precise_topic=f"dp-{testbed.tag}",
            data_dir=tmp_path / "data",
            precise_lookahead_s=2.0,
        )
    settings = testbed.settings(**values)
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(
        f"dropped-{testbed.tag}", 3, {"message.timestamp.type": "LogAppendTime"}
    )
    from delayservice.producer import DelayProducer

    thread_prefix = "precise-intake-" if precise else "consumer-"
    start = threading.Event()
    with _failing_consumer_lines(thread_prefix, start) as failing:
        daemon = testbed.start_daemon(settings)
        testbed.wait_assigned(daemon, partitions=settings.partitions)
        start.set()
        producer = DelayProducer(
            {"bootstrap.servers": testbed.bootstrap, "linger.ms": 5},
            settings=settings,
            **({"precision": "exact"} if precise else {}),
        )
        rng = random.Random(4711)
        sent: set[str] = set()
        for i in range(MESSAGES):
            if i % 250 == 0:
                time.sleep(0.5)  # records keep coming while lines fail
            delay = rng.uniform(1.0, 2.5) if precise else rng.choice((1, 2))
            sent.add(producer.produce(target, b"%d" % i, b"k%d" % (i % 50), delay=delay))
        assert producer.flush(30) == 0
        records = testbed.collect(target, MESSAGES, timeout=120)
    return failing, sent, records, daemon


def _judge(sent: set[str], records: list[Any], guarantee: str) -> None:
    ids = [_headers(r)["delay-id"].decode() for r in records]
    assert sent - set(ids) == set(), f"{len(sent - set(ids))} of {MESSAGES} never arrived"
    early = [r for r in records if r.timestamp()[1] < int(_headers(r)["delay-due-ms"])]
    assert early == [], f"{len(early)} arrived before their due time"
    if guarantee == "exactly-once":
        assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} arrived twice"
