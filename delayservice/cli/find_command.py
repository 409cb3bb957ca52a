"""`delayservice find ID`: where one message is."""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated, Final

import typer

from delayservice.cli.common import (
    BootstrapOption,
    ConfigOption,
    ProgressLine,
    fail,
    friendly_errors,
)
from delayservice.cli.pending_command import when
from delayservice.forward import dead_letter as dl
from delayservice.levels import format_duration_ms, parse_duration_ms
from delayservice.markers.replies import CANCEL, CANCELLED
from delayservice.settings_loading import load_settings
from delayservice.status.marker_trail import MOVED, Marker
from delayservice.status.message_finder import NOT_FOUND, Whereabouts, find
from delayservice.status.topic_scan import Hit

DEFAULT_SINCE = "1d"


def _at(hit: Hit, now_ms: int) -> str:
    where = f"{hit.topic} partition {hit.partition} offset {hit.offset}"
    return f"{where}, at {when(hit.timestamp_ms, now_ms)}"


_OUTCOMES: Final = {
    "accepted": "accepted",
    "too_late": "too late: the message had been sent",
    "unmatched": "unmatched: no pending message had this id there",
    "cancelled": "not moved: a cancel came first, and cancels win",
    "refused": "refused (a bad marker, a time beyond max_delay, or a full log; the "
    "daemon's log says which)",
    "superseded": "moved, then moved again by a later reschedule",
}


def _outcome(marker: Marker, found: Whereabouts) -> str:
    """What the daemon did with one marker, or why that is not known."""
    now = found.now_ms
    reply = marker.reply
    if reply is None:
        asked = marker.asked_due_ms
        wish = "" if asked is None else f" (asked for due {when(asked, now)})"
        if found.outcomes_read is False:
            return f"outcome unknown: {found.outcomes_topic} does not exist{wish}"
        return f"no reply yet{wish}"
    if reply.outcome == MOVED:
        return f"moved, due {when(reply.due_ms, now)}"
    if reply.outcome == CANCELLED and marker.kind == CANCEL:
        said = "cancelled: it will not be delivered"
    else:
        said = _OUTCOMES.get(reply.outcome, reply.outcome)
    return f"{said} ({reply.reason})" if reply.reason else said


def _markers(found: Whereabouts) -> list[str]:
    now = found.now_ms
    lines = [
        f"  cancelled   by the marker on {_at(c.hit, now)}: {_outcome(c, found)}"
        for c in found.cancels
    ]
    lines.extend(
        f"  rescheduled by the marker on {_at(r.hit, now)}: {_outcome(r, found)}"
        for r in found.reschedules
    )
    return lines


def _notes(found: Whereabouts) -> list[str]:
    notes = []
    if len(found.forwarded) > 1:
        notes.append(f"{len(found.forwarded)} copies on the target (duplicates)")
    if found.forwarded and found.cancels:
        notes.append("the cancel came too late: the message had been sent")
    if any(r.reply is None for r in found.reschedules):
        notes.append("the due time leaves out reschedules whose outcome is not known")
    return [f"  note        {note}" for note in notes]


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
    if found.original_due_ms != found.due_ms:
        lines.append(f"  first due   {when(found.original_due_ms, now)}")
    lines.extend(_markers(found))
    lines.extend(f"  forwarded   to {_at(copy, now)}" for copy in found.forwarded)
    for dead in found.dead_letters:
        reason = dead.headers.get(dl.H_REASON, b"?").decode(errors="replace")
        detail = dead.headers.get(dl.H_DETAIL, b"").decode(errors="replace")
        lines.append(f"  dead letter {_at(dead, now)}: {reason}{f' ({detail})' if detail else ''}")
    lines.extend(_notes(found))
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
    forwarded (where and when) or dead-lettered (why); or not found in the window. For
    an exact message, also each cancel and reschedule of it and what the daemon did
    with it; a moved message is due when its last move says.

    Kafka has no index by header, so this reads every record of the window: an exact
    id's one precise partition (and the replies to its markers), or every level
    partition for a level id, then the message's target and the dead-letter topic from
    the time it was sent. Exit code 1 when the message is not found.
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
