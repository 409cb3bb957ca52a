"""`delayservice find ID`: where one message is."""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated

import typer

from delayservice.cli.common import (
    BootstrapOption,
    ConfigOption,
    ProgressLine,
    fail,
    friendly_errors,
)
from delayservice.cli.pending_command import when
from delayservice.levels import format_duration_ms, parse_duration_ms
from delayservice.settings import load_settings
from delayservice.status.message_finder import NOT_FOUND, Whereabouts, find
from delayservice.status.topic_scan import Hit
from delayservice.worker import dead_letter as dl

DEFAULT_SINCE = "1d"


def _at(hit: Hit, now_ms: int) -> str:
    where = f"{hit.topic} partition {hit.partition} offset {hit.offset}"
    return f"{where}, at {when(hit.timestamp_ms, now_ms)}"


def render(found: Whereabouts) -> str:
    now = found.now_ms
    window = f"appended since {when(found.since_ms, now)}"
    if found.source is None:
        return (
            f"{found.message_id}: not found in {', '.join(found.searched) or 'no topic'} "
            f"({window}; read {found.records_read:,} records)"
        )
    lines = [f"{found.message_id}: {found.state}"]
    lines.append(f"  sent to     {_at(found.source, now)} (level {found.level})")
    lines.append(f"  due         {when(found.due_ms, now)}, for {found.target}")
    lines.extend(f"  cancelled   by the marker on {_at(c, now)}" for c in found.cancels)
    lines.extend(f"  forwarded   to {_at(copy, now)}" for copy in found.forwarded)
    for dead in found.dead_letters:
        reason = dead.headers.get(dl.H_REASON, b"?").decode(errors="replace")
        detail = dead.headers.get(dl.H_DETAIL, b"").decode(errors="replace")
        lines.append(f"  dead letter {_at(dead, now)}: {reason}{f' ({detail})' if detail else ''}")
    if len(found.forwarded) > 1:
        lines.append(f"  note        {len(found.forwarded)} copies on the target (duplicates)")
    if found.forwarded and found.cancels:
        lines.append("  note        the cancel came too late: the message had been sent")
    lines.append(
        f"  searched    {', '.join(found.searched)} ({window}; {found.records_read:,} records)"
    )
    return "\n".join(lines)


@friendly_errors
def find_message(
    message_id: Annotated[
        str, typer.Argument(metavar="ID", help="The message id (delay-id) produce() returned.")
    ],
    config: ConfigOption = None,
    bootstrap_servers: BootstrapOption = None,
    since: Annotated[
        str,
        typer.Option(
            "--since",
            help="How far back the message may have been sent, e.g. 90m, 7d; records "
            "older than that are not read.",
        ),
    ] = DEFAULT_SINCE,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Where one message is: waiting (due when, on which partition), cancelled,
    forwarded (where and when) or dead-lettered (why); or not found in the window.

    Kafka has no index by header, so this reads every record of the window: an exact
    id's one precise partition, or every level partition for a level id, then the
    message's target and the dead-letter topic from the time it was sent. Exit code 1
    when the message is not found.
    """
    if not message_id.strip():
        raise fail("the message id is empty", 2)
    try:
        window_ms = parse_duration_ms(since)
    except ValueError as exc:
        raise fail(f"--since {since!r}: {exc}", 2) from None
    settings = load_settings(config, bootstrap_servers=bootstrap_servers)
    now_ms = int(time.time() * 1000)
    since_ms = now_ms - window_ms
    label = f"reading the last {format_duration_ms(window_ms)} of records"
    with ProgressLine(label, enabled=sys.stderr.isatty() and not as_json) as progress:
        found = find(settings, message_id, since_ms, now_ms, progress.add)
    if as_json:
        typer.echo(json.dumps(found.as_json()))
    else:
        typer.echo(render(found))
    if found.state == NOT_FOUND:
        raise typer.Exit(1)
