"""Load: the audit's outputs, each for a different reader.

Parquet (one row per message) is for the operator who has to find the lost ones; the
JSON summary is for machines (cron, CI, dashboards); the PNG is for the person who
asks how late "late" is; the console table is for whoever ran the command.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from delayservice.audit import PRECISE_LEVEL
from delayservice.audit.summary import BROKEN, COUNTS, SummaryRow

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

MESSAGES = "messages.parquet"
SUMMARY = "summary.json"
PLOT = "lateness.png"


def write_messages(messages: DataFrame, out_dir: Path) -> Path:
    path = out_dir / MESSAGES
    messages.write.mode("overwrite").parquet(str(path))
    return path


def write_summary(document: dict[str, Any], out_dir: Path) -> Path:
    path = out_dir / SUMMARY
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
    return path


def human_ms(value: float | None) -> str:
    """Lateness as a person reads it: 12ms, 1.25s, 3m04s; '-' when there is none."""
    if value is None:
        return "-"
    sign, ms = ("-" if value < 0 else ""), abs(value)
    if ms < 1000:
        return f"{sign}{ms:.0f}ms"
    if ms < 60_000:
        return f"{sign}{ms / 1000:.2f}s"
    minutes, seconds = divmod(round(ms / 1000), 60)
    return f"{sign}{minutes}m{seconds:02d}s"


def console_table(rows: Sequence[SummaryRow]) -> str:
    """Levels, then targets, then the total; the per level-and-target rows stay in the JSON."""
    shown = [r for r in rows if r.scope != "level+target"]
    header = ["", *(c.upper() for c in COUNTS), "P50", "P95", "P99", "MAX"]
    body = [
        [
            r.label,
            *(str(r.counts[c]) for c in COUNTS),
            *(human_ms(r.lateness_ms[k]) for k in ("p50", "p95", "p99", "max")),
        ]
        for r in shown
    ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def fmt(line: list[str]) -> str:
        return "  ".join(
            [
                line[0].ljust(widths[0]),
                *(cell.rjust(w) for cell, w in zip(line[1:], widths[1:], strict=True)),
            ]
        )

    rule = "-" * len(fmt(header))
    lines = [fmt(header), rule]
    for row, line in zip(shown, body, strict=True):
        if row.scope == "total":
            lines.append(rule)
        lines.append(fmt(line))
    return "\n".join(lines)


def plot_lateness(
    histogram: tuple[int, list[tuple[int, str, int, int]]],
    rows: Sequence[SummaryRow],
    out_dir: Path,
) -> Path:
    """One histogram per level (the precise topic's `exact` last), with its p50/p95/p99
    marked, 'due' at zero, and its broken promises in the title."""
    # A bare Figure renders with Agg and leaves pyplot's global state (and backend) alone.
    from matplotlib.figure import Figure  # optional extra, heavy: import only when auditing

    width, bins = histogram
    levels = [r for r in rows if r.scope == "level"]
    widest = max((abs(start) + width for _, _, start, _ in bins), default=0)
    unit, scale = ("s", 1000.0) if widest >= 2000 else ("ms", 1.0)
    fig = Figure(figsize=(8, 1.2 + 1.5 * max(1, len(levels))))
    axes = fig.subplots(max(1, len(levels)), 1, sharex=True, squeeze=False)[:, 0]
    if not levels:
        axes[0].text(
            0.5,
            0.5,
            "no messages in the audited range",
            ha="center",
            va="center",
            transform=axes[0].transAxes,
        )
    for ax, row in zip(axes, levels, strict=False):
        own = [(start, count) for index, _, start, count in bins if index == row.level_index]
        _panel(ax, row, own, width / scale, scale)
    axes[-1].set_xlabel(f"lateness: delivery time minus due time, {unit} (red line: due)")
    fig.suptitle("DelayService delivery audit: lateness per level", fontsize=11)
    fig.tight_layout()
    path = out_dir / PLOT
    fig.savefig(path, dpi=90)
    return path


def _panel(
    ax: Any, row: SummaryRow, bins: list[tuple[int, int]], width: float, scale: float
) -> None:
    if bins:
        ax.bar(
            [s / scale for s, _ in bins],
            [c for _, c in bins],
            width=width,
            align="edge",
            color="#4c72b0",
            edgecolor="white",
            linewidth=0.3,
        )
        ax.set_yscale("log")  # the tail is what matters, and it is a few messages tall
        ax.set_ylim(bottom=0.7)
    for name, style in (("p50", ":"), ("p95", "--"), ("p99", "-.")):
        value = row.lateness_ms[name]
        if value is not None:
            ax.axvline(
                value / scale,
                color="#dd8452",
                linestyle=style,
                linewidth=1,
                label=f"{name} {human_ms(value)}",
            )
    if bins:
        ax.legend(fontsize=7, loc="upper right")
    ax.axvline(0, color="#c44e52", linewidth=1)
    ax.set_ylabel("messages")
    faults = "".join(f", {row.counts[k]} {k}" for k in BROKEN if row.counts[k])
    # The precise topic's index only sorts it last; it is no level number.
    name = "precise topic" if row.level == PRECISE_LEVEL else f"level {row.level_index}"
    ax.set_title(
        f"{name} ({row.level}): {row.counts['delivered']} delivered{faults}, "
        f"max {human_ms(row.lateness_ms['max'])}",
        fontsize=9,
        loc="left",
        color="#c44e52" if faults else "black",
    )
