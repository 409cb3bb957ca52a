"""The `delayservice` command: thin commands over the library."""

from __future__ import annotations

import importlib.util
import sys
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
    # Docstrings are wrapped at 88 columns: markdown joins the lines of a paragraph.
    rich_markup_mode="markdown",
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


def usage_line(exc: BaseException) -> str | None:
    """A command-line usage error (an unknown flag, a value its type refuses, a missing
    argument) as one line naming the command and the flag; None for anything else."""
    message = getattr(exc, "format_message", None)
    if getattr(exc, "exit_code", None) != 2 or message is None:  # typer's UsageError
        return None
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "delayservice"
    text = " ".join(str(message()).split())
    return f"{command}: {text} (see {command} --help)"


def main(args: list[str] | None = None) -> None:
    """The `delayservice` command: every bad flag value ends as one line and exit 2."""
    try:
        code = app(args=args, prog_name="delayservice", standalone_mode=False)
    except typer.Abort:
        typer.echo("delayservice: aborted", err=True)
        sys.exit(1)
    except Exception as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            help_text = getattr(exc, "format_message", None)
            typer.echo(help_text() if help_text is not None else str(exc), err=True)
            sys.exit(2)
        line = usage_line(exc)
        if line is None:
            raise
        typer.echo(line, err=True)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
