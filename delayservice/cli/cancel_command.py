"""`delayservice cancel`: withdraw one delayed message, level or exact, by its id."""

from __future__ import annotations

from typing import Annotated

import typer

from delayservice.cli.common import (
    BootstrapOption,
    ConfigOption,
    JsonOption,
    fail,
    friendly_errors,
)
from delayservice.cli.marker_command import WaitOption, send_marker
from delayservice.settings_loading import load_settings


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
    as_json: JsonOption = False,
) -> None:
    """Cancel a delayed message, level or exact, before it is due.

    Prints where the cancel marker landed, then the daemon's reply: cancelled (a level
    message) or accepted (an exact one): it will not be delivered; else too_late,
    unmatched (no such message there, or an id from before level ids named their
    place) or refused. Exit 1 unless it will not be delivered.
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
        as_json=as_json,
    )
