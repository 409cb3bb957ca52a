"""What `cancel` and `reschedule` share: send one marker, say where it landed, then
wait for the daemon's reply and say what it did."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any, Final

import typer

from delayservice.cli.common import echo_json, fail
from delayservice.cli.pending_command import when
from delayservice.kafka import client_config
from delayservice.markers.outcome import RepliesUnavailableError
from delayservice.markers.receipt import DeliveryCallback, MarkerReceipt
from delayservice.markers.replies import CANCEL, CANCELLED, MarkerReply
from delayservice.producer import DelayProducer
from delayservice.settings import Settings

FLUSH_TIMEOUT_S: Final = 40.0
"""Above the producer's 30 s message timeout, so a failing marker ends with librdkafka's
own reason rather than a bare timeout (with --wait 0)."""

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
    "refused": "the daemon refused it (a bad marker, a time beyond max_delay, or a full "
    "log); its log says which",
    "superseded": "it moved the message, and a later reschedule moved it again",
}


def describe(reply: MarkerReply, now_ms: int) -> str:
    """One line for a reply: the outcome and what it means (and why, when the daemon
    said)."""
    if reply.outcome == "moved":
        meaning = f"due {when(reply.due_ms, now_ms)}"
    elif reply.outcome == CANCELLED:
        meaning = (
            "it will not be delivered"
            if reply.kind == CANCEL
            else "a cancel came first, and cancels win"
        )
    else:
        meaning = _MEANING.get(reply.outcome, "an outcome this version does not know")
    if reply.reason:
        meaning = f"{meaning} ({reply.reason})"
    holder = f"member {reply.member}" if reply.member is not None else "the daemon"
    if reply.role:
        holder += f" ({reply.role})"
    return f"{reply.outcome} by {holder}: {meaning}"


Send = Callable[[DelayProducer, float | None, DeliveryCallback], MarkerReceipt | MarkerReply]
"""Queues one marker through the SDK: waiting `float` seconds for the reply (None: not)."""


def send_marker(
    settings: Settings,
    what: str,
    message_id: str,
    send: Send,
    wait_s: float,
    *,
    as_json: bool = False,
) -> None:
    """Send one marker, print where it landed, then the daemon's reply (with `as_json`,
    one JSON object with both). Exit 1 when it was not written, was not applied, or no
    reply came within `wait_s` (0: no wait). Waiting needs the outcomes topic, which is
    checked before anything is sent."""
    where: dict[str, Any] = {}

    def landed(err: Any, msg: Any) -> None:
        if err is None:
            where.update(topic=msg.topic(), partition=msg.partition(), offset=msg.offset())
            if not as_json:
                typer.echo(
                    f"{what} of {message_id} is on {msg.topic()} partition "
                    f"{msg.partition()} offset {msg.offset()}"
                )

    producer = DelayProducer(
        client_config.producer(settings, f"delayservice-{what}"), settings=settings
    )
    if wait_s <= 0:
        receipt = send(producer, None, landed)
        assert isinstance(receipt, MarkerReceipt)
        receipt.landed(FLUSH_TIMEOUT_S)
        if as_json:
            echo_json({"kind": what, "id": message_id, "landed": where, "reply": None})
        return
    try:
        reply = send(producer, wait_s, landed)
    except RepliesUnavailableError as exc:
        raise fail(f"{exc}; or pass --wait 0 to send without waiting for the reply", 1) from None
    assert isinstance(reply, MarkerReply)
    line = f"{what} of {message_id}: {describe(reply, int(time.time() * 1000))}"
    if as_json:
        echo_json({"kind": what, "id": message_id, "landed": where, "reply": reply_json(reply)})
    elif reply.applied:
        typer.echo(line)
    if not reply.applied:
        raise fail(line, 1) if not as_json else typer.Exit(1)


def reply_json(reply: MarkerReply) -> dict[str, Any]:
    """A reply as data. `applied` is the one field that means the same in both modes: a
    kept cancel is `cancelled` from a level worker and `accepted` from a precise one."""
    return {
        "outcome": reply.outcome,
        "applied": reply.applied,
        "due_ms": reply.due_ms,
        "reason": reply.reason,
        "member": reply.member,
        "role": reply.role,
    }
