"""`delayservice reschedule`: move one pending delayed message to a new time."""

from __future__ import annotations

from typing import Annotated

import typer

from delayservice.cli.common import (
    AtOption,
    BootstrapOption,
    ConfigOption,
    DelayOption,
    JsonOption,
    delivery_time,
    fail,
    friendly_errors,
)
from delayservice.cli.marker_command import WaitOption, send_marker
from delayservice.settings_loading import load_settings


@friendly_errors
def reschedule(
    message_id: Annotated[
        str,
        typer.Argument(
            metavar="ID", help="The message id (delay-id) that `send` or produce() returned."
        ),
    ],
    delay: DelayOption = None,
    deliver_at: AtOption = None,
    wait: WaitOption = 30.0,
    config: ConfigOption = None,
    bootstrap_servers: BootstrapOption = None,
    as_json: JsonOption = False,
) -> None:
    """Move a pending delayed message, level or exact, to a new due time, earlier or
    later.

    It keeps its id, key, value and headers and is delivered once: an exact message at
    the new time, a level one at the smallest level at least as long as what is left
    then, never before the new time (a time already past means at once). A cancel wins
    over a reschedule. Prints where the reschedule marker landed, then the daemon's
    reply: moved (and the new due time), too_late, unmatched, cancelled or refused.
    Exit 1 unless moved.
    """
    settings = load_settings(config, bootstrap_servers=bootstrap_servers)
    if not message_id.strip():
        raise fail("the message id is empty", 2)
    delay_s, deliver_at = delivery_time(delay, deliver_at, required=True)
    send_marker(
        settings,
        "reschedule",
        message_id,
        lambda producer, wait_s, report: producer.reschedule(
            message_id, delay=delay_s, deliver_at=deliver_at, wait=wait_s, on_delivery=report
        ),
        wait,
        as_json=as_json,
    )
