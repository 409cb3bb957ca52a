"""A fresh broker's start-up is INFO; real problems, and start-up that lasts, stay loud."""

import logging
import time
import uuid

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from delayservice.kafka.client_config import librdkafka_logger
from delayservice.kafka.log_levels import (
    TRANSIENT,
    ExpectedFences,
    StartupNoise,
    facility_and_text,
)

LOADING = (
    "[thrd:main]: Failed to acquire idempotence PID from broker 127.0.0.1:52641/1: "
    "Broker: Coordinator load in progress: retrying"
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    "text",
    [
        LOADING,
        "Failed to acquire transactional PID from broker b/1: Broker: Coordinator not "
        "available: retrying",
        "Failed to acquire transactional PID from broker b/1: Broker: Not coordinator: retrying",
    ],
)
def test_a_producer_id_asked_of_a_loading_coordinator_is_info(text: str) -> None:
    assert StartupNoise().level_for("GETPID", text, logging.WARNING) == logging.INFO


def test_a_commit_refused_while_the_group_coordinator_loads_is_info() -> None:
    text = (
        "Offset commit (manual) failed for 1/1 partition(s) in join-state steady: "
        "Broker: Coordinator load in progress: t[0]@5"
    )
    assert StartupNoise().level_for("COMMITFAIL", text, logging.WARNING) == logging.INFO


@pytest.mark.parametrize(
    ("facility", "text", "level"),
    [
        # the same facility, a real problem
        (
            "GETPID",
            "Failed to acquire idempotence PID from broker b/1: Broker: Cluster "
            "authorization failed: retrying",
            logging.WARNING,
        ),
        # the same words under a facility the table does not name
        ("OFFSET", "t [0]: offset reset (at offset 5) to END: Coordinator load in progress", 30),
        ("FAIL", "Connect to ipv4#127.0.0.1:9092 failed: Connection refused", logging.ERROR),
        ("MAXPOLL", "Application maximum poll interval (300000ms) exceeded", logging.WARNING),
    ],
)
def test_anything_else_keeps_its_level(facility: str, text: str, level: int) -> None:
    assert StartupNoise().level_for(facility, text, level) == level


def test_a_transient_condition_that_lasts_past_the_grace_period_is_a_warning_again() -> None:
    clock = Clock()
    noise = StartupNoise(grace_s=30, clock=clock)
    for _ in range(30):  # librdkafka retries about every second
        assert noise.level_for("GETPID", LOADING, logging.WARNING) == logging.INFO
        clock.now += 1
    clock.now += 1
    assert noise.level_for("GETPID", LOADING, logging.WARNING) == logging.WARNING


def test_a_quiet_gap_longer_than_the_grace_period_starts_a_new_streak() -> None:
    clock = Clock()
    noise = StartupNoise(grace_s=30, clock=clock)
    assert noise.level_for("GETPID", LOADING, logging.WARNING) == logging.INFO
    clock.now += 3600  # the broker restarts an hour later
    assert noise.level_for("GETPID", LOADING, logging.WARNING) == logging.INFO


def test_every_table_entry_says_why() -> None:
    assert all(entry.errors and len(entry.why) > 40 for entry in TRANSIENT)


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def logger_at(level: int) -> tuple[logging.Logger, Collect]:
    logger = logging.getLogger(f"test.log_levels.{uuid.uuid4().hex}")
    logger.propagate = False
    logger.setLevel(level)
    logger.addFilter(StartupNoise())
    collect = Collect()
    logger.addHandler(collect)
    return logger, collect


def test_a_lowered_line_is_dropped_by_a_logger_that_shows_only_warnings() -> None:
    logger, collect = logger_at(logging.WARNING)
    logger.log(logging.WARNING, "%s [%s] %s", "GETPID", "rdkafka#producer-1", LOADING)
    logger.log(logging.WARNING, "%s [%s] %s", "REQTMOUT", "rdkafka#producer-1", "Timed out")
    assert [r.args[0] for r in collect.records if isinstance(r.args, tuple)] == ["REQTMOUT"]
    assert collect.records[0].levelno == logging.WARNING


def test_a_lowered_line_goes_out_at_info_where_info_is_shown() -> None:
    logger, collect = logger_at(logging.INFO)
    logger.log(logging.WARNING, "%s [%s] %s", "GETPID", "rdkafka#producer-1", LOADING)
    (record,) = collect.records
    assert (record.levelno, record.levelname) == (logging.INFO, "INFO")
    assert "Coordinator load in progress" in record.getMessage()


def test_lines_not_shaped_like_librdkafkas_pass_untouched() -> None:
    logger, collect = logger_at(logging.WARNING)
    logger.warning("Coordinator load in progress")
    logger.warning("%s %s", "GETPID", LOADING)
    assert [r.levelno for r in collect.records] == [logging.WARNING, logging.WARNING]


def test_the_librdkafka_logger_lowers_start_up_noise_once() -> None:
    librdkafka_logger()
    logger = librdkafka_logger()
    assert sum(isinstance(f, StartupNoise) for f in logger.filters) == 1


def test_the_client_logs_in_the_shape_the_table_reads() -> None:
    """The facility is found in a real client's record, not only in hand-made ones."""
    logger, collect = logger_at(logging.DEBUG)
    producer = Producer({"bootstrap.servers": "127.0.0.1:1", "logger": logger})
    deadline = time.monotonic() + 20
    while not collect.records and time.monotonic() < deadline:
        producer.poll(0.2)
    assert collect.records, "the client logged nothing about a refused connection"
    assert facility_and_text(collect.records[0]) is not None
    assert collect.records[0].args[0] == "FAIL"  # type: ignore[index]


class Captured:
    """A logger that keeps what it is given, as confluent-kafka hands it."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []

    def log(self, level: int, msg: str, *args: object) -> None:
        self.lines.append((level, msg % args))


FENCE_LINES = [
    (
        "TXNERR",
        "Fatal transaction error: Failed to add partitions to transaction: Local: This "
        "instance has been fenced by a newer instance (_FENCED)",
    ),
    (
        "FATAL",
        "Fatal error: Broker: There is a newer producer with the same transactionalId "
        "which fences the current one: Failed to end transaction",
    ),
    ("TXNERR", "Broker: Producer attempted an operation with an old epoch"),
]


@pytest.mark.parametrize(("facility", "text"), FENCE_LINES)
def test_an_expected_fence_is_a_warning(facility: str, text: str) -> None:
    captured = Captured()
    ExpectedFences(captured).log(logging.CRITICAL, "%s [%s] %s", facility, "p#producer-1", text)
    assert captured.lines == [(logging.WARNING, f"{facility} [p#producer-1] {text}")]


@pytest.mark.parametrize(
    ("level", "facility", "text"),
    [
        # another fatal error stays fatal
        (logging.CRITICAL, "FATAL", "Fatal error: Broker: Topic authorization failed"),
        (logging.ERROR, "FAIL", "Connect to ipv4#127.0.0.1:9092 failed: Connection refused"),
        # a fence line that is quieter already stays so
        (logging.DEBUG, "TXN", "instance has been fenced by a newer instance"),
    ],
)
def test_everything_else_keeps_its_level(level: int, facility: str, text: str) -> None:
    captured = Captured()
    ExpectedFences(captured).log(level, "%s [%s] %s", facility, "p#producer-1", text)
    assert captured.lines == [(level, f"{facility} [p#producer-1] {text}")]


def _fenced_producer_lines(bootstrap: str, topic: str, logger: object) -> None:
    """Fence a transactional producer that logs to `logger` the way a takeover does (a
    second producer inits its transactional id), then let it try to commit."""
    txn_id = f"fence-lines-{uuid.uuid4()}"
    first = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "logger": logger})
    first.init_transactions(30)
    first.begin_transaction()
    first.produce(topic, b"before the fence")
    first.flush(30)
    second = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    second.init_transactions(30)
    first.produce(topic, b"after the fence")
    with pytest.raises(KafkaException):
        first.commit_transaction(30)
    first.poll(0.5)  # serves the log lines left
    second.flush(5)


@pytest.mark.kafka
def test_a_real_fence_is_logged_critical_and_at_warning_when_expected(
    kafka_bootstrap: str, unique_name
) -> None:
    topic = unique_name("fence-lines")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    bare = Captured()
    _fenced_producer_lines(kafka_bootstrap, topic, bare)
    critical = [text for level, text in bare.lines if level >= logging.CRITICAL]
    assert critical, f"librdkafka logged no CRITICAL line for the fence: {bare.lines}"
    expected = Captured()
    _fenced_producer_lines(kafka_bootstrap, topic, ExpectedFences(expected))
    fenced = [(level, text) for level, text in expected.lines if "fence" in text]
    assert fenced, expected.lines
    assert all(level <= logging.WARNING for level, _ in expected.lines), expected.lines
