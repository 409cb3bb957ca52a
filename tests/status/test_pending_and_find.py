"""`delayservice pending` and `delayservice find` against a real daemon holding level and
precise messages, some waiting, one cancelled, one moved, one whose move was refused,
one forwarded and one dead-lettered."""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from delayservice.cli.app import app
from delayservice.envelope import H_DELAY_MS, H_RESCHEDULE, H_VERSION
from delayservice.kafka import client_config
from delayservice.markers.outcome import ReplyWatch
from delayservice.markers.precise_ids import named_partition
from delayservice.settings_loading import settings_env

pytestmark = pytest.mark.kafka

DAY_S = 86_400
MOVED_TO_S = 120
NEVER_FAR = "366d"
"""As long as `max_delay`: every exact message here goes to the precise topic, none to
the far one."""


def _cli(settings: Any, *args: str) -> Any:
    env = settings_env(settings)
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


def _id(message: Any) -> str:
    return dict(message.headers() or [])["delay-id"].decode()


def _stamp(epoch_ms: int) -> str:
    """How `find` writes a time, before the relative part."""
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


class _Landed:
    """The delivery report of one marker: where it landed, to wait for its reply."""

    def __init__(self) -> None:
        self.where: tuple[str, int, int] | None = None

    def __call__(self, error: Any, message: Any) -> None:
        assert error is None, error
        self.where = (message.topic(), message.partition(), message.offset())


def _refused_reschedule(bootstrap: str, topic: str, message_id: str, landed: _Landed) -> None:
    """A reschedule marker beyond max_delay, which the producer would not send: the
    daemon refuses it."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    headers = [(H_VERSION, b"1"), (H_RESCHEDULE, message_id.encode())]
    headers.append((H_DELAY_MS, str(400 * DAY_S * 1000).encode()))
    partition = named_partition(message_id)
    assert partition is not None
    producer.produce(topic, None, None, partition, headers=headers, on_delivery=landed)
    assert producer.flush(30) == 0


@pytest.fixture
def holding(testbed: Any, tmp_path: Path) -> dict[str, Any]:
    """A daemon holding: 3 level messages due in a minute, 5 exact ones spread from 30 s
    to 40 days, one sent for 40 days and moved to 2 minutes, one sent for 2 days whose
    move was refused, and what became of one forwarded, one dead-lettered, one
    cancelled."""
    from delayservice.producer import DelayProducer

    settings = testbed.settings(
        levels="1s,1m",
        precise=True,
        precise_topic=f"dp-{testbed.tag}",
        precise_far_after=NEVER_FAR,
        data_dir=tmp_path / "data",
        precise_lookahead_s=2.0,
    )
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(f"target-{testbed.tag}")
    daemon = testbed.start_daemon(settings)
    testbed.wait_for(lambda: daemon.readiness()[0], 60, "the daemon to be ready")
    settings = settings.model_copy(update={"metrics_port": daemon.metrics_port})

    sent: dict[str, Any] = {"settings": settings, "target": target, "daemon": daemon}
    with DelayProducer({"bootstrap.servers": testbed.bootstrap}, settings=settings) as producer:
        sent["level_waiting"] = [producer.produce(target, b"w", delay=60) for _ in range(3)]
        sent["forwarded"] = producer.produce(target, b"f", delay=1)
        sent["dead"] = producer.produce(f"missing-{testbed.tag}", b"d", delay=1)
        sent["sent_ms"] = int(time.time() * 1000)
    watch = ReplyWatch(client_config.common(settings), settings.precise_outcomes_topic)
    landed = {"cancel": _Landed(), "moved": _Landed(), "refused": _Landed()}
    with DelayProducer(
        {"bootstrap.servers": testbed.bootstrap}, settings=settings, precision="exact"
    ) as producer:
        sent["exact"] = {
            delay: producer.produce(target, b"e", delay=delay)
            for delay in (30, 2 * 3600, 2 * DAY_S, 20 * DAY_S, 40 * DAY_S)
        }
        sent["cancelled"] = producer.produce(target, b"c", delay=45)
        sent["moved"] = producer.produce(target, b"m", delay=40 * DAY_S)
        sent["refused"] = producer.produce(target, b"r", delay=2 * DAY_S)
        producer.flush(30)
        producer.cancel(sent["cancelled"], on_delivery=landed["cancel"])
        producer.reschedule(sent["moved"], delay=MOVED_TO_S, on_delivery=landed["moved"])
    refused = landed["refused"]
    _refused_reschedule(testbed.bootstrap, settings.precise_topic, sent["refused"], refused)
    replies = {}
    try:
        for what, marker in landed.items():
            assert marker.where is not None
            reply = watch.wait(*marker.where, timeout=60)
            replies[what] = reply.outcome if reply else None
    finally:
        watch.close()
    assert replies == {"cancel": "accepted", "moved": "moved", "refused": "refused"}
    arrived = testbed.collect(target, 1, timeout=60)
    assert [_id(m) for m in arrived] == [sent["forwarded"]]
    sent["forwarded_at"] = (arrived[0].partition(), arrived[0].offset())
    testbed.collect(settings.dead_letter_topic, 1, timeout=60)

    def settled() -> bool:  # every exact message on disk, the cancel matched
        result = _cli(settings, "pending", "--json")
        rows = {r["level"]: r for r in json.loads(result.stdout)["rows"]}
        exact = rows["exact"]
        return exact["in_kafka"] == 0 and exact["held"] == 7 and rows["1m"]["held"] == 3

    testbed.wait_for(settled, 60, "the daemon to hold everything and match the cancel")
    return sent


def test_pending_counts_what_waits_by_level_and_by_due_time(holding):
    settings = holding["settings"]
    result = _cli(settings, "pending", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    rows = {r["level"]: r for r in report["rows"]}
    assert set(rows) == {"1s", "1m", "exact", "exact-far"}
    assert rows["exact-far"]["waiting"] == 0  # NEVER_FAR: everything on the near topic
    assert rows["1s"]["waiting"] == 0
    assert rows["1s"]["oldest_overdue_s"] == 0
    minute = rows["1m"]
    assert minute["waiting"] == 3
    assert minute["held"] == 3
    assert holding["sent_ms"] < minute["next_due_ms"] < holding["sent_ms"] + 61_000
    exact = rows["exact"]
    # Each message once: the moved one at its new time (within the hour), not at 40 days.
    assert exact["by_due"] == {"overdue": 0, "1m": 1, "1h": 1, "1d": 1, "30d": 3, "later": 1}
    assert exact["waiting"] == 7
    assert exact["replica_copies"] == 0
    assert exact["oldest_overdue_s"] == 0

    text = _cli(settings, "pending")
    assert text.exit_code == 0
    assert "exact" in text.stdout
    assert "due: overdue 0 · 1m 1 · 1h 1 · 1d 1 · 30d 3 · later 1" in text.stdout


def test_find_says_where_each_message_is(holding):
    settings = holding["settings"]

    def find(message_id: str) -> tuple[int, dict[str, Any]]:
        result = _cli(settings, "find", message_id, "--json", "--since", "10m")
        return result.exit_code, json.loads(result.stdout)

    code, waiting = find(holding["level_waiting"][0])
    assert code == 0
    assert waiting["state"] == "waiting"
    assert waiting["level"] == "1m"
    assert waiting["due_ms"] > time.time() * 1000

    code, forwarded = find(holding["forwarded"])
    assert forwarded["state"] == "forwarded"
    (copy,) = forwarded["forwarded"]
    assert (copy["topic"], copy["partition"], copy["offset"]) == (
        holding["target"],
        *holding["forwarded_at"],
    )
    assert copy["timestamp_ms"] >= forwarded["due_ms"]

    code, dead = find(holding["dead"])
    assert dead["state"] == "dead-lettered"
    assert [d["reason"] for d in dead["dead_lettered"]] == ["unknown_topic"]

    code, exact = find(holding["exact"][2 * DAY_S])
    assert exact["state"] == "waiting"
    assert exact["level"] == "exact"
    assert exact["source"]["partition"] == int(holding["exact"][2 * DAY_S].rsplit("-p", 1)[1])

    code, cancelled = find(holding["cancelled"])
    assert cancelled["state"] == "cancelled"
    assert [c["outcome"] for c in cancelled["cancels"]] == ["accepted"]
    assert cancelled["reschedules"] == []

    code, missing = find("0" * 32 + "-p0")
    assert code == 1
    assert missing["state"] == "not found"
    assert missing["searched"]

    text = _cli(settings, "find", holding["forwarded"], "--since", "10m")
    assert f"forwarded   to {holding['target']} partition" in text.stdout


def test_find_says_what_each_reschedule_did_and_when_the_message_is_due_now(holding):
    settings = holding["settings"]

    def find(message_id: str) -> tuple[dict[str, Any], str]:
        found = _cli(settings, "find", message_id, "--json", "--since", "10m")
        text = _cli(settings, "find", message_id, "--since", "10m")
        assert found.exit_code == text.exit_code == 0, found.output + text.output
        return json.loads(found.stdout), text.stdout

    moved, text = find(holding["moved"])
    (marker,) = moved["reschedules"]
    assert marker["outcome"] == "moved"
    assert marker["due_ms"] == marker["asked_due_ms"] == marker["timestamp_ms"] + MOVED_TO_S * 1000
    assert [r["role"] for r in marker["replies"]] == ["owner"]
    assert moved["due_ms"] == marker["due_ms"]
    assert moved["original_due_ms"] == moved["source"]["timestamp_ms"] + 40 * DAY_S * 1000
    assert moved["state"] == "waiting"
    assert moved["outcomes_read"] is True
    assert settings.precise_outcomes_topic in moved["searched"]
    where = f"{settings.precise_topic} partition {marker['partition']} offset {marker['offset']}"
    assert f"  rescheduled by the marker on {where}, at " in text
    lines = {line[:14]: line for line in text.splitlines()}
    assert f": moved, due {_stamp(marker['due_ms'])}" in lines["  rescheduled "]
    assert lines["  due         "].startswith(f"  due         {_stamp(marker['due_ms'])}")
    assert lines["  first due   "].startswith(f"  first due   {_stamp(moved['original_due_ms'])}")

    refused, text = find(holding["refused"])
    (marker,) = refused["reschedules"]
    assert marker["outcome"] == "refused"
    assert marker["due_ms"] is None
    assert refused["due_ms"] == refused["original_due_ms"]
    assert refused["due_ms"] == refused["source"]["timestamp_ms"] + 2 * DAY_S * 1000
    assert refused["state"] == "waiting"
    assert ": refused (" in text
    assert f"  due         {_stamp(refused['due_ms'])}" in text
    assert "first due" not in text


def test_the_daemons_gauges_give_the_same_figures(holding):
    from delayservice.precise.precise_worker import LEVEL_NAME, PreciseWorker

    daemon = holding["daemon"]
    (worker,) = [
        w for w in daemon.workers if isinstance(w, PreciseWorker) and w.level.name == LEVEL_NAME
    ]
    worker.census.take()  # the background census runs every 30 s; take one now
    report = json.loads(_cli(holding["settings"], "pending", "--json").stdout)
    rows = {r["level"]: r for r in report["rows"]}
    url = f"http://127.0.0.1:{daemon.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}

    def value(name: str, **labels: str) -> float:
        (sample,) = [
            s
            for s in families[name].samples
            if all(s.labels.get(k) == v for k, v in labels.items())
        ]
        return sample.value

    for due, count in rows["exact"]["by_due"].items():
        assert (
            value("delayservice_precise_pending_messages", level="exact", copy="owner", due=due)
            == count
        )
    # The moved message counts once, at its new time, on the dashboard too.
    pending = "delayservice_precise_pending_messages"
    assert value(pending, level="exact", copy="owner", due="1h") == 1
    assert value(pending, level="exact", copy="owner", due="later") == 1
    assert (
        value("delayservice_next_due_timestamp_seconds", level="exact") * 1000
        == (rows["exact"]["next_due_ms"])
    )
    held_due = value("delayservice_next_due_timestamp_seconds", level="1m") * 1000
    assert held_due == rows["1m"]["next_due_ms"]  # the head it holds is the one in Kafka
    assert value("delayservice_oldest_overdue_seconds", level="1m") == 0


def test_find_says_the_outcome_is_unknown_without_the_outcomes_topic(testbed):
    """Markers read, no daemon and no outcomes topic: `find` still answers, with the due
    time the message was sent with."""
    from delayservice.producer import DelayProducer

    settings = testbed.settings(
        precise=True, precise_topic=f"dp-{testbed.tag}", precise_far_after=NEVER_FAR
    )
    testbed.create_topic(settings.precise_topic, config={"message.timestamp.type": "LogAppendTime"})
    with DelayProducer(
        {"bootstrap.servers": testbed.bootstrap}, settings=settings, precision="exact"
    ) as producer:
        message_id = producer.produce(f"target-{testbed.tag}", b"m", delay=DAY_S)
        producer.reschedule(message_id, delay=MOVED_TO_S)
        producer.flush(30)

    result = _cli(settings, "find", message_id, "--json", "--since", "10m")
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert found["outcomes_read"] is False
    (marker,) = found["reschedules"]
    assert marker["outcome"] is None
    assert marker["replies"] == []
    assert marker["asked_due_ms"] == marker["timestamp_ms"] + MOVED_TO_S * 1000
    assert (
        found["due_ms"]
        == found["original_due_ms"]
        == found["source"]["timestamp_ms"] + (DAY_S * 1000)
    )
    assert found["state"] == "waiting"
    assert settings.precise_outcomes_topic not in found["searched"]

    text = _cli(settings, "find", message_id, "--since", "10m").stdout
    missing = f"outcome unknown: {settings.precise_outcomes_topic} does not exist"
    assert f": {missing} (asked for due {_stamp(marker['asked_due_ms'])}" in text
    assert "note        the due time leaves out reschedules whose outcome is not known" in text


def test_far_messages_are_found_and_counted_on_the_far_topic(testbed: Any, tmp_path: Path):
    """Beyond `precise_far_after` exact messages wait on the far topic, in its own wheel:
    `pending` gives that wheel a row of its own (level exact-far), `find` looks where the
    id says, and a move of a far message shows there too."""
    from delayservice.producer import DelayProducer

    settings = testbed.settings(
        levels="1s",
        precise=True,
        precise_topic=f"dp-{testbed.tag}",
        precise_far_after="1m",
        data_dir=tmp_path / "data",
    )
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(f"target-{testbed.tag}")
    daemon = testbed.start_daemon(settings)
    testbed.wait_for(lambda: daemon.readiness()[0], 60, "the daemon to be ready")
    settings = settings.model_copy(update={"metrics_port": daemon.metrics_port})
    watch = ReplyWatch(client_config.common(settings), settings.precise_outcomes_topic)
    moved_landed = _Landed()
    with DelayProducer(
        {"bootstrap.servers": testbed.bootstrap}, settings=settings, precision="exact"
    ) as producer:
        near = producer.produce(target, b"n", delay=45)
        far = producer.produce(target, b"f", delay=DAY_S)
        moved = producer.produce(target, b"m", delay=3 * DAY_S)
        producer.flush(30)
        producer.reschedule(moved, delay=2 * 3600, on_delivery=moved_landed)
    try:
        assert moved_landed.where is not None
        reply = watch.wait(*moved_landed.where, timeout=60)
    finally:
        watch.close()
    assert reply is not None
    assert reply.outcome == "moved"
    assert moved_landed.where[0] == settings.precise_far_topic

    def rows() -> dict[str, Any]:
        report = json.loads(_cli(settings, "pending", "--json").stdout)
        return {r["level"]: r for r in report["rows"]}

    testbed.wait_for(
        lambda: rows()["exact-far"]["held"] == 2 and rows()["exact"]["held"] == 1,
        30,
        "both wheels to hold their messages",
    )
    counted = rows()
    assert counted["exact-far"]["topic"] == settings.precise_far_topic
    assert counted["exact-far"]["by_due"]["1h"] == 0
    assert counted["exact-far"]["by_due"]["1d"] == 2  # the moved one once, at 2 h
    assert counted["exact"]["by_due"]["1m"] == 1
    found = json.loads(_cli(settings, "find", far, "--json").stdout)
    assert (found["state"], found["level"]) == ("waiting", "exact-far")
    assert found["source"]["topic"] == settings.precise_far_topic
    found = json.loads(_cli(settings, "find", moved, "--json").stdout)
    assert found["due_ms"] == reply.due_ms
    assert [r["outcome"] for r in found["reschedules"]] == ["moved"]
    found = json.loads(_cli(settings, "find", near, "--json").stdout)
    assert (found["level"], found["source"]["topic"]) == ("exact", settings.precise_topic)
