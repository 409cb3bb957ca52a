"""`delayservice pending`: what waits, per level and for precise mode."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from delayservice.cli.common import (
    BootstrapOption,
    ConfigOption,
    friendly_errors,
    local_endpoint,
)
from delayservice.precise.storage import due_buckets
from delayservice.precise.storage.census import count_files
from delayservice.settings_loading import load_settings
from delayservice.status.pending_report import PendingRow, level_rows, precise_row

PROGRESS_FROM_FILES = 200
"""A census of fewer files finishes before a progress bar would help."""


def when(due_ms: int | None, now_ms: int) -> str:
    if due_ms is None:
        return "-"
    stamp = datetime.fromtimestamp(due_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    ahead = (due_ms - now_ms) / 1000
    return (
        f"{stamp}Z ({'in ' if ahead >= 0 else ''}{_span(abs(ahead))}{' ago' if ahead < 0 else ''})"
    )


def _span(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


def render(rows: list[PendingRow], now_ms: int) -> str:
    lines = [f"{'level':<6} {'topic':<24} {'waiting':>9} {'held':>9}  next due / oldest overdue"]
    for row in rows:
        held = "?" if row.held is None else f"{row.held:,}"
        overdue = row.overdue_s(now_ms)
        due = f"overdue by {_span(overdue)}" if overdue else when(row.next_due_ms, now_ms)
        lines.append(f"{row.level:<6} {row.topic:<24} {row.waiting:>9,} {held:>9}  {due}")
        if row.by_due is not None:
            counts = " · ".join(f"{name} {row.by_due[name]:,}" for name in due_buckets.NAMES)
            lines.append(f"{'':6} due: {counts}; replica copies {row.replica_copies:,}")
        lines.extend(f"{'':6} note: {note}" for note in row.notes)
    return "\n".join(lines)


@friendly_errors
def pending(
    config: ConfigOption = None,
    bootstrap_servers: BootstrapOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Machine-readable output, one object per row.")
    ] = False,
    metrics_url: Annotated[
        list[str] | None,
        typer.Option(
            "--metrics-url",
            help="A daemon's /metrics, for what it holds in memory; repeat for several "
            "(default: this host's metrics_host and metrics_port).",
            show_default=False,
        ),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help="Precise mode's data directory (default: data_dir).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """How many messages wait, per level and for precise mode, when the next is due and
    how overdue the oldest is.

    "waiting" counts what is in Kafka and not yet committed past (levels), or not yet
    taken in plus what is on this host's disk (precise mode); "held" is what the
    daemons hold (levels: in memory; precise: on disk, by due time).
    """
    settings = load_settings(config, bootstrap_servers=bootstrap_servers)
    # What the daemons hold in memory is extra: with a port picked at start (0) and no
    # --metrics-url, it is left out rather than failing what Kafka alone can answer.
    urls = metrics_url or (
        [local_endpoint(settings, "/metrics")] if settings.metrics_port != 0 else []
    )
    now_ms = int(time.time() * 1000)
    rows = level_rows(settings, urls)
    if settings.precise:
        base = data_dir or settings.data_dir
        topics = (settings.precise_topic, settings.precise_far_topic)
        files = sum(count_files(base / topic) for topic in topics)
        if files >= PROGRESS_FROM_FILES and sys.stderr.isatty() and not as_json:
            with typer.progressbar(length=files, label="census", file=sys.stderr) as bar:
                rows.extend(
                    precise_row(settings, now_ms, data_dir, lambda _: bar.update(1), far=far)
                    for far in (False, True)
                )
        else:
            rows.extend(precise_row(settings, now_ms, data_dir, far=far) for far in (False, True))
    if as_json:
        typer.echo(json.dumps({"now_ms": now_ms, "rows": [r.as_json(now_ms) for r in rows]}))
    else:
        typer.echo(render(rows, now_ms))
