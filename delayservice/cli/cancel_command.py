"""`delayservice cancel`: withdraw one precise-mode message by its id."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from delayservice.cli.common import (
    BootstrapOption,
    ConfigOption,
    fail,
    friendly_errors,
)
from delayservice.kafka import client_config
from delayservice.producer import DelayProducer
from delayservice.settings import Settings, load_settings

FLUSH_TIMEOUT_S = 40.0
"""Above the producer's 30 s message timeout, so a failing cancel ends with librdkafka's
own reason rather than a bare timeout."""


@friendly_errors
def cancel(
    message_id: Annotated[
        str,
        typer.Argument(
            metavar="ID", help="The message id (delay-id) that `send` or produce() returned."
        ),
    ],
    config: ConfigOption = None,
    bootstrap_servers: BootstrapOption = None,
) -> None:
    """Cancel a message sent with exact precision, before it is due.

    Level-mode messages cannot be cancelled. Prints where the cancel marker landed.
    """
    settings = load_settings(config, bootstrap_servers=bootstrap_servers)
    if not message_id.strip():
        raise fail("the message id is empty", 2)
    send_marker(
        settings,
        "cancel",
        message_id,
        lambda producer, report: producer.cancel(message_id, on_delivery=report),
    )


def send_marker(
    settings: Settings,
    what: str,
    message_id: str,
    send: Callable[[DelayProducer, Callable[[Any, Any], None]], None],
) -> None:
    """Send one marker (`send` queues it with the delivery callback given) and print
    where it landed; exit 1 when it was not written."""
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
    typer.echo(
        f"{what} of {message_id} is on {msg.topic()} partition {msg.partition()} "
        f"offset {msg.offset()}"
    )
