"""`ClientLines`, the logger every daemon client is given: a line whose logging raises
is dropped and counted, never raised into the client's call."""

from __future__ import annotations

import io
import logging
import sys

import pytest
from confluent_kafka import KafkaError
from prometheus_client import CollectorRegistry

from delayservice.kafka.client_lines import ClientLines
from delayservice.kafka.log_levels import ExpectedFences
from delayservice.kafka.unconfirmed_acks import UnconfirmedAcks
from delayservice.metrics.service_metrics import ServiceMetrics


class _Failing(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        raise RuntimeError("a logging filter failed")


@pytest.fixture
def failing_logger() -> logging.Logger:
    logger = logging.getLogger("tests.client_lines.failing")
    logger.addFilter(_Failing())
    return logger


@pytest.mark.parametrize(
    "make",
    [ClientLines, ExpectedFences, lambda logger: UnconfirmedAcks(logger, pass_debug=True)],
)
def test_a_line_whose_logging_raises_is_dropped_counted_and_told_once(
    failing_logger: logging.Logger, make: type[ClientLines], capsys: pytest.CaptureFixture[str]
) -> None:
    lines = make(failing_logger)
    for _ in range(3):
        lines.log(logging.WARNING, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "text")
    assert lines.dropped == 3
    told = capsys.readouterr().err
    assert told.count("a librdkafka log line could not be logged") == 1
    assert "a logging filter failed" in told


def test_every_dropped_line_of_every_client_is_counted_for_prometheus(
    failing_logger: logging.Logger,
) -> None:
    """The stderr line comes once per client; the counter moves with each line dropped,
    whichever client dropped it, and not for a line that was logged."""
    registry = CollectorRegistry()
    ServiceMetrics(registry)
    name = "delayservice_librdkafka_lines_dropped_total"
    before = registry.get_sample_value(name)
    assert before is not None
    first, second = ClientLines(failing_logger), ExpectedFences(failing_logger)
    for lines in (first, second, first):
        lines.log(logging.WARNING, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "text")
    ClientLines(logging.getLogger("tests.client_lines.plain")).log(
        logging.INFO, "%s [%s] %s", "CONNECT", "rdkafka#consumer-1", "connected"
    )
    assert registry.get_sample_value(name) == before + 3


def test_lines_that_can_be_logged_pass_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tests.client_lines.plain")
    lines = ClientLines(logging.getLogger("tests.client_lines.plain"))
    lines.log(logging.INFO, "%s [%s] %s", "CONNECT", "rdkafka#consumer-1", "connected")
    assert lines.dropped == 0
    assert [r.getMessage() for r in caplog.records] == ["CONNECT [rdkafka#consumer-1] connected"]


def test_inferred_successes_are_counted_even_when_the_line_cannot_be_logged(
    failing_logger: logging.Logger,
) -> None:
    """The count decides whether the forwarder sends its open interval again: a logger
    that fails must not lose it."""
    watch = UnconfirmedAcks(failing_logger, pass_debug=True)
    watch.log(logging.DEBUG, "%s [%s] %s", "IMPLICITACK", "rdkafka#producer-1", "acked")
    assert watch.take() == (1, "IMPLICITACK: acked")


def test_a_closed_stderr_does_not_make_the_guard_raise(
    failing_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr(sys, "stderr", closed)
    lines = ClientLines(failing_logger)
    lines.log(logging.WARNING, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "text")
    assert lines.dropped == 1


class _BareError(logging.Filter):
    """Raises a bare `KafkaError`, which no `except Exception` catches."""

    def filter(self, record: logging.LogRecord) -> bool:
        from tests.level.fakes import raise_bare_kafka_error

        raise_bare_kafka_error(KafkaError(KafkaError._TRANSPORT, "left bare"))
        return True


def test_a_bare_kafka_error_from_the_logging_is_dropped_too(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logger = logging.getLogger("tests.client_lines.bare")
    logger.addFilter(_BareError())
    lines = ClientLines(logger)
    lines.log(logging.WARNING, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "text")
    assert lines.dropped == 1
    assert "left bare" in capsys.readouterr().err


def test_the_notice_on_stderr_stays_one_short_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    class _Long(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            raise RuntimeError("x" * 100_000)

    logger = logging.getLogger("tests.client_lines.long")
    logger.addFilter(_Long())
    ClientLines(logger).log(logging.WARNING, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "t")
    told = capsys.readouterr().err.splitlines()
    assert len(told) == 1
    assert len(told[0]) < 500
    assert "more characters" in told[0]
