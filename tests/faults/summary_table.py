"""The fault-injection summary table: one row per scenario's `Report`.

A scenario's row rides on its test's report (`user_properties`), so a run split over
pytest-xdist workers still prints one table, in the controller (tests/conftest.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROW_PROPERTY = "fault_summary_row"
COLUMNS = (
    "scenario",
    "records",
    "lost",
    "duplicates",
    "dead-lettered",
    "early",
    "p99 lateness",
    "max lateness",
    "recovery",
    "notes",
)
RECOVERY_NOTE = (
    "recovery: from the end of the fault (restarted daemon spawned, broker ready again, "
    "SIGCONT, both members signalled) until every level-topic partition has forwarded "
    "again, by target append time; the worst fault of the scenario (2: a restart killed "
    "again before it forwarded counts until a later one does). 6: from re-creation to "
    "the first record on the re-created target. Lateness: target append time - due, "
    "first copy; due = level-topic append time + max(level delay, delay-ms); in precise "
    "mode, precise-topic append time + delay-ms, or delay-due-ms when that is later."
)


def render(rows: list[dict[str, str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += [
        "| " + " | ".join(row.get(c, "") for c in COLUMNS) + " |"
        for row in sorted(rows, key=lambda r: _number(r["scenario"]))
    ]
    return "\n".join([*lines, "", RECOVERY_NOTE])


def _number(scenario: str) -> tuple[int, str]:
    """ "5b. slowed revokes" -> (5, "b. slowed revokes"): rows in the scenarios' order."""
    match = re.match(r"(\d+)(.*)", scenario, re.DOTALL)
    return (int(match[1]), match[2]) if match else (0, scenario)


def rows_of(user_properties: list[tuple[str, Any]]) -> list[dict[str, str]]:
    return [value for name, value in user_properties if name == ROW_PROPERTY]


def write(terminalreporter: Any, rootpath: Path, rows: list[dict[str, str]]) -> None:
    """Print the table and leave it in build/faults-summary.md."""
    table = render(rows)
    terminalreporter.write_sep("=", "fault-injection summary")
    terminalreporter.write_line(table)
    out = rootpath / "build" / "faults-summary.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(f"# Fault-injection summary\n\n{table}\n")
    terminalreporter.write_line(f"(written to {out})")
