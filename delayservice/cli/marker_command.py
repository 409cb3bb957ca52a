"""What `cancel` and `reschedule` share: send one marker, say where it landed, then
wait for the daemon's reply and say what it did."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any, Final

import typer

from delayservice.cli.common import fail
from delayservice.cli.pending_command import when
from delayservice.errors import DelayServiceError
from delayservice.kafka import client_config
from delayservice.precise.marker_replies import MarkerReply
from delayservice.producer import DelayProducer
from delayservice.settings import Settings
from delayservice.status.marker_outcome import ReplyWatch

FLUSH_TIMEOUT_S: Final = 40.0
"""Above the producer's 30 s message timeout, so a failing marker ends with librdkafka's
own reason rather than a bare timeout."""

WaitOption = Annotated[
    float,
    typer.Option(
        "--wait",
        min=0,
        help="Seconds to wait for the daemon's reply (what it did); 0: do not wait.",
    ),
]

_MEANING: Final = {
    "accepted": "the message, if still pending, will not be delivered",
    "too_late": "the message was already sent",
    "unmatched": "no pending message has this id on that partition",
    "cancelled": "a cancel came first, and cancels win",
    "refused": "the daemon refused it (a bad marker, a time beyond max_delay, or a full "
    "log); its log says which",
    "superseded": "it moved the message, and a later reschedule moved it again",
}


def describe(reply: MarkerReply, now_ms: int) -> str:
    """One line for a reply: the outcome and what it means."""
    if reply.outcome == "moved":
        meaning = f"due {when(reply.due_ms, now_ms)}"
    else:
        meaning = _MEANING.get(reply.outcome, "an outcome this version does not know")
    holder = f"member {reply.member}" if reply.member is not None else "the daemon"
    if reply.role:
        holder += f" ({reply.role})"
    return f"{reply.outcome} by {holder}: {meaning}"


def send_marker(
    settings: Settings,
    what: str,
    message_id: str,
    send: Callable[[DelayProducer, Callable[[Any, Any], None]], None],
    wait_s: float,
) -> None:
    """Send one marker (`send` queues it with the delivery callback given), print where
    it landed, then the daemon's reply. Exit 1 when it was not written, was not
    applied, or no reply came within `wait_s`."""
    watch = None
    if wait_s > 0:
        try:
            watch = ReplyWatch(client_config.common(settings), settings.precise_outcomes_topic)
        except DelayServiceError as exc:
            raise fail(
                f"{exc}; or pass --wait 0 to send without waiting for the reply", 1
            ) from None
    try:
        topic, partition, offset = _send(settings, what, message_id, send)
        typer.echo(f"{what} of {message_id} is on {topic} partition {partition} offset {offset}")
        if watch is None:
            return
        reply = watch.wait(topic, partition, offset, wait_s)
    finally:
        if watch is not None:
            watch.close()
    if reply is None:
        raise fail(
            f"{what} of {message_id}: no reply within {wait_s:g} s; the marker is written "
            f"and takes effect when the daemon holding partition {partition} reads it "
            "(is it running?)",
            1,
        )
    line = f"{what} of {message_id}: {describe(reply, int(time.time() * 1000))}"
    if not reply.applied:
        raise fail(line, 1)
    typer.echo(line)


def _send(
    settings: Settings,
    what: str,
    message_id: str,
    send: Callable[[DelayProducer, Callable[[Any, Any], None]], None],
) -> tuple[str, int, int]:
    reports: list[tuple[Any, Any]] = []

    def delivered(err: Any, msg: Any) -> None:
        reports.append((err, msg))

    producer = DelayProducer(
        client_config.producer(settings, f"delayservice-{what}"), settings=settings
    )
    send(producer, delivered)
    producer.flush(FLUSH_TIMEOUT_S)
    if not reports:
        raise fail(f"{what} of {message_id} not delivered: timed out", 1)
    err, msg = reports[0]
    if err is not None:
        raise fail(f"{what} of {message_id} not delivered: {err.str()}", 1)
    return msg.topic(), msg.partition(), msg.offset()
