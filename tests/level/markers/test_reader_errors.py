"""How the level markers' reader reports a failed read: a fresh topic's or broker's
start-up answers (a leader not elected yet, a coordinator loading) at INFO while they
are young, the same answers once they outlast the grace period, and anything else, at
WARNING. A demo or CI run fails on any WARNING line, and a markers topic created a
moment before the reader starts gives exactly such an answer."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError, KafkaException
from prometheus_client import CollectorRegistry

from delayservice.kafka.log_levels import GraceStreaks
from delayservice.level.markers.book import MarkerBook
from delayservice.level.markers.gate import MarkerGate
from delayservice.level.markers.reader import MarkerReader
from delayservice.log_throttle import Throttle
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.settings_loading import load_settings
from tests.level.fakes import FakeClock, wait_for

GRACE_S = 60.0


def _failing_reader(error: Exception, clock: FakeClock, calls: list[float]) -> MarkerReader:
    """A reader whose every consumer refuses to be made with `error`, each attempt
    30 s (fake) after the one before."""
    settings = load_settings(levels="1s,5s", bootstrap_servers="127.0.0.1:9")
    levels = settings.level_set()

    def make_consumer(_config: dict[str, object]) -> object:
        calls.append(clock.monotonic())
        clock.advance(30)
        raise error

    reader = MarkerReader(
        settings,
        MarkerBook(levels),
        MarkerGate(100),
        ServiceMetrics(CollectorRegistry()),
        clock.ms,
        make_consumer=make_consumer,  # type: ignore[arg-type]
    )
    reader._throttle = Throttle(every_s=0.0)  # every attempt logs
    reader._starting = GraceStreaks(GRACE_S, clock=clock.monotonic)
    return reader


def _levels_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.levelname
        for r in caplog.records
        if r.name == "delayservice.level.markers.reader" and "reading again" in r.getMessage()
    ]


def _run(reader: MarkerReader, calls: list[float], attempts: int) -> None:
    reader.start()
    try:
        wait_for(lambda: len(calls) >= attempts, f"{attempts} attempts", timeout=10.0)
    finally:
        reader.request_stop()
        assert reader.join(5.0)  # the last attempt's line is logged by then


def test_a_leader_not_elected_yet_is_info_while_young_and_a_warning_once_it_lasts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="delayservice.level.markers.reader")
    clock, calls = FakeClock(), []
    error = KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
    _run(_failing_reader(error, clock, calls), calls, 4)
    levels = _levels_of(caplog)
    # Attempts 30 s apart: 0, 30 and 60 s into the streak are young, 90 s is not.
    assert levels[:3] == ["INFO", "INFO", "INFO"]
    assert "WARNING" in levels[3:]


def test_any_other_error_is_a_warning_at_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="delayservice.level.markers.reader")
    clock, calls = FakeClock(), []
    error = KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    _run(_failing_reader(error, clock, calls), calls, 1)
    assert _levels_of(caplog)[:1] == ["WARNING"]
