"""`delayservice send`: one delayed message from the shell."""

from __future__ import annotations

from typing import Annotated, Any, Final

import typer

from delayservice.cli.common import (
    AtOption,
    BootstrapOption,
    ConfigOption,
    DelayOption,
    JsonOption,
    delivery_time,
    echo_json,
    fail,
    friendly_errors,
)
from delayservice.envelope import Headers
from delayservice.kafka import client_config
from delayservice.producer import DelayProducer
from delayservice.settings_loading import load_settings

SEND_TIMEOUT_MS: Final = 10_000


@friendly_errors
def send(
    topic: Annotated[str, typer.Argument(help="The real topic.")],
    value: Annotated[str, typer.Argument(help="Message value (UTF-8).")],
    delay: DelayOption = None,
    deliver_at: AtOption = None,
    key: Annotated[str | None, typer.Option("--key", "-k", show_default=False)] = None,
    partition: Annotated[int, typer.Option(help="Explicit target partition (-1: by key).")] = -1,
    header: Annotated[
        list[str] | None,
        typer.Option("--header", "-H", help="name=value, repeatable.", show_default=False),
    ] = None,
    exact: Annotated[
        bool,
        typer.Option(
            "--exact",
            help="Precise mode: deliver at exactly the delay asked (cancellable by its id), "
            "not at the level that holds it.",
        ),
    ] = False,
    config: ConfigOption = None,
    bootstrap_servers: BootstrapOption = None,
    as_json: JsonOption = False,
) -> None:
    """Send one message with a delay and print its id (for `delayservice cancel`); with
    --json, also where it landed (the delay topic, partition and offset)."""
    settings = load_settings(config, bootstrap_servers=bootstrap_servers)
    headers: Headers = []
    for item in header or []:
        name, sep, hvalue = item.partition("=")
        if not sep or not name:
            raise fail(f"--header {item!r} is not name=value", 2)
        headers.append((name, hvalue.encode()))
    delay_s, deliver_at = delivery_time(delay, deliver_at)
    errors: list[str] = []
    landed: dict[str, object] = {}

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            landed.update(topic=msg.topic(), partition=msg.partition(), offset=msg.offset())

    # One message from a shell: an outage fails in 10 s (librdkafka waits 300 s by
    # default); a `producer` setting of message.timeout.ms still wins.
    producer_config = client_config.producer(
        settings, "delayservice-send", defaults={"message.timeout.ms": SEND_TIMEOUT_MS}
    )
    producer = DelayProducer(producer_config, settings=settings)
    try:
        message_id = producer.produce(
            topic,
            value.encode(),
            key.encode() if key else None,
            partition,
            on_delivery=delivered,
            headers=headers,
            delay=delay_s,
            deliver_at=deliver_at,
            precision="exact" if exact else "level",
        )
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    if producer.flush(30) or errors:
        raise fail(f"not delivered: {errors[0] if errors else 'timed out'}", 1)
    if as_json:
        echo_json({"id": message_id, **landed})
    else:
        typer.echo(message_id)
