"""`delayservice topics create|describe`."""

from __future__ import annotations

import typer
from confluent_kafka.admin import AdminClient

from delayservice.cli.common import (
    BootstrapOption,
    ConfigOption,
    JsonOption,
    echo_json,
    fail,
    friendly_errors,
)
from delayservice.kafka import client_config, topics
from delayservice.settings_loading import load_settings

app = typer.Typer(
    help="Create and check the delay-level and dead-letter topics.", no_args_is_help=True
)


def _table(rows: list[dict[str, object]]) -> str:
    if not rows:
        return ""
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in columns)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


@app.command()
@friendly_errors
def create(
    config: ConfigOption = None,
    bootstrap_servers: BootstrapOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create missing topics (LogAppendTime, long retention); safe to run again."""
    settings = load_settings(config, bootstrap_servers=bootstrap_servers)
    admin = AdminClient(client_config.admin(settings))
    made = []
    for spec, outcome in topics.create(admin, settings):
        made.append(
            {
                "outcome": outcome,
                "topic": spec.name,
                "role": spec.role,
                "partitions": spec.partitions,
            }
        )
        if not as_json:
            typer.echo(f"{outcome:8} {spec.name} ({spec.role}, {spec.partitions} partitions)")
    statuses = topics.describe(admin, settings)
    problems = topics.problems_summary(statuses)
    advice = topics.advice(statuses, settings)
    if as_json:
        echo_json({"topics": made, "problems": problems, "advice": advice})
        if problems:
            raise typer.Exit(2)
    for line in advice:
        typer.echo(f"note: {line}", err=True)
    if problems:
        raise fail("existing topics need attention:\n  " + "\n  ".join(problems), 2)


@app.command()
@friendly_errors
def describe(
    config: ConfigOption = None,
    bootstrap_servers: BootstrapOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show the topics and say plainly what is wrong with them; exit 2 if anything is."""
    settings = load_settings(config, bootstrap_servers=bootstrap_servers)
    statuses = topics.describe(AdminClient(client_config.admin(settings)), settings)
    problems = topics.problems_summary(statuses)
    advice = topics.advice(statuses, settings)
    if as_json:
        echo_json({"topics": topics.as_rows(statuses), "problems": problems, "advice": advice})
    else:
        typer.echo(_table(topics.as_rows(statuses)))
        for line in advice:
            typer.echo(f"note: {line}", err=True)
    if problems:
        raise typer.Exit(2)
