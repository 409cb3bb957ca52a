"""The `delayservice` command: thin commands over the library."""

from __future__ import annotations

import importlib.util
from typing import Annotated

import typer

from delayservice import __version__
from delayservice.cli import (
    cancel_command,
    check_command,
    find_command,
    pending_command,
    reschedule_command,
    run_command,
    send_command,
    settings_command,
    topics_command,
)

app = typer.Typer(
    name="delayservice",
    help="Delayed delivery for Apache Kafka: level topics, a producer wrapper "
    "and a forwarding daemon.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command()(run_command.run)
app.command()(send_command.send)
app.command()(cancel_command.cancel)
app.command()(reschedule_command.reschedule)
app.command()(check_command.check)
app.command()(pending_command.pending)
app.command(name="find")(find_command.find_message)
app.command()(settings_command.settings)
app.add_typer(topics_command.app, name="topics")

# Optional commands live in their own modules and register themselves when present.
for _name in ("delayservice.cli.audit_command",):
    if importlib.util.find_spec(_name) is not None:
        importlib.import_module(_name).register(app)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"delayservice {__version__}")
        raise typer.Exit


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Delayed delivery for Apache Kafka."""


def main() -> None:
    app()
