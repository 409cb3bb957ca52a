"""A fresh broker's start-up is INFO; real problems, and start-up that lasts, stay loud."""

import logging
import time
import uuid

import pytest
from confluent_kafka import Producer

from delayservice.kafka.client_config import librdkafka_logger
from delayservice.kafka.log_levels import TRANSIENT, StartupNoise, facility_and_text

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
