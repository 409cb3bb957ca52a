"""`delayservice cancel`: withdraw one precise-mode message by its id."""

from __future__ import annotations

from typing import Annotated

import typer

from delayservice.cli.common import (
    BootstrapOption,
    ConfigOption,
    fail,
    friendly_errors,
)
from delayservice.cli.marker_command import WaitOption, send_marker
from delayservice.settings import load_settings


@friendly_errors
def cancel(
    message_id: Annotated[
        str,
        typer.Argument(
            metavar="ID", help="The message id (delay-id) that `send` or produce() returned."
        ),
    ],
    wait: WaitOption = 30.0,
    config: ConfigOption = None,
    bootstrap_servers: BootstrapOption = None,
) -> None:
    """Cancel a message sent with exact precision, before it is due.

    Level-mode messages cannot be cancelled. Prints where the cancel marker landed,
    then the daemon's reply: accepted (the message, if still pending, will not be
    delivered), too_late, unmatched or refused. Exit 1 unless accepted.
    """
    settings = load_settings(config, bootstrap_servers=bootstrap_servers)
    if not message_id.strip():
        raise fail("the message id is empty", 2)
    send_marker(
        settings,
        "cancel",
        message_id,
        lambda producer, wait_s, report: producer.cancel(
            message_id, wait=wait_s, on_delivery=report
        ),
        wait,
    )
