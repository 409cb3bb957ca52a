"""The level producer's watch for successes librdkafka inferred without the broker's word."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from delayservice.kafka import client_config
from delayservice.kafka.unconfirmed_acks import UnconfirmedAcks, watch_unconfirmed
from delayservice.settings_loading import load_settings

IMPLICIT = "t [0] 2 message(s) implicitly acked by subsequent batch success (msgids 5..6)"


class Lines:
    """A logger that keeps what it was given."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str, str]] = []

    def log(self, level: int, msg: str, *args: Any) -> None:
        self.lines.append((level, str(args[0]), str(args[2])))


def librdkafka_line(watch: UnconfirmedAcks, level: int, facility: str, text: str) -> None:
    watch.log(level, "%s [%s] %s", facility, "rdkafka#producer-1", text)


@pytest.mark.parametrize("facility", ["IMPLICITACK", "DUPSEQ"])
def test_an_inferred_success_is_counted_once_and_taken(facility: str) -> None:
    watch = UnconfirmedAcks(Lines(), pass_debug=False)
    librdkafka_line(watch, logging.DEBUG, facility, IMPLICIT)
    assert watch.take() == (1, f"{facility}: {IMPLICIT}")
    assert watch.take() == (0, "")


def test_other_debug_lines_are_neither_counted_nor_passed_on_unless_asked_for() -> None:
    quiet, asked = Lines(), Lines()
    for logger, pass_debug in ((quiet, False), (asked, True)):
        watch = UnconfirmedAcks(logger, pass_debug=pass_debug)
        librdkafka_line(watch, logging.DEBUG, "NEWPID", "t [0] changed producer id")
        librdkafka_line(watch, logging.WARNING, "FAIL", "Connect failed")
        assert watch.take() == (0, "")
    assert quiet.lines == [(logging.WARNING, "FAIL", "Connect failed")]
    assert [facility for _, facility, _ in asked.lines] == ["NEWPID", "FAIL"]


@pytest.mark.parametrize(
    ("asked", "result"),
    [(None, "eos"), ("broker,topic", "broker,topic,eos"), ("eos", "eos"), ("all", "all")],
)
def test_the_eos_context_joins_the_users_own_debug_contexts(asked: str | None, result: str) -> None:
    config: dict[str, Any] = {} if asked is None else {"debug": asked}
    watch_unconfirmed(config)
    assert config["debug"] == result
    assert isinstance(config["logger"], UnconfirmedAcks)


@pytest.mark.kafka
def test_a_real_level_producer_routes_its_eos_lines_through_the_watch(
    kafka_bootstrap: str, unique_name: Any
) -> None:
    """The daemon's own producer config, a real client and broker: librdkafka's `eos`
    lines reach the watch when the producer is polled (here passed on, as a user who
    asked for `debug=eos` would see them)."""
    settings = load_settings(bootstrap_servers=kafka_bootstrap, kafka={"debug": "eos"})
    config = client_config.level_producer(settings, unique_name("client"))
    lines = Lines()
    config["logger"] = lines
    watch = watch_unconfirmed(config)
    producer = Producer(config)
    topic = unique_name("watched")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    reports: list[Any] = []
    producer.produce(topic, b"v", on_delivery=lambda error, _msg: reports.append(error))
    assert producer.flush(30) == 0
    assert reports == []  # only failures are reported: delivered (it never creates a topic)
    producer.poll(0)
    facilities = {facility for level, facility, _ in lines.lines if level == logging.DEBUG}
    assert facilities & {"NEWPID", "IDEMPSTATE", "GETPID"}, facilities
    assert watch.take() == (0, "")
