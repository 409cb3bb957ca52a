"""`delayservice settings`: the settings in force, or the one line saying which is wrong.

The daemon, the CLI and `DelayProducer` load the same sources (`load_settings`), so
this shows what each of them sees here: a deploy step or a CI job can check a settings
file and an environment before a restart (exit 2 when a setting is invalid).
"""

from __future__ import annotations

import json

import typer

from delayservice.cli.common import (
    BootstrapOption,
    ConfigOption,
    JsonOption,
    echo_json,
    friendly_errors,
)
from delayservice.settings import load_settings, redacted


@friendly_errors
def settings(
    config: ConfigOption = None,
    bootstrap_servers: BootstrapOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print every setting in force (librdkafka secrets shown as <redacted>); exit 2 and
    one line naming the setting when one is invalid."""
    current = load_settings(config, bootstrap_servers=bootstrap_servers)
    shown = {
        name: redacted(value) if isinstance(value, dict) else value
        for name, value in current.model_dump(mode="json").items()
    }
    if as_json:
        echo_json(shown)
        return
    for name, value in shown.items():
        typer.echo(f"{name} = {json.dumps(value)}")
