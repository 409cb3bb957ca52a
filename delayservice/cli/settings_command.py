"""`delayservice settings`: the settings in force, or the one line saying which is wrong.

The daemon, the CLI and `DelayProducer` load the same sources (`load_settings`), so
this shows what each of them sees here: a deploy step or a CI job can check a settings
file and an environment before a restart. It fails where the daemon would: a setting
`load_settings` refuses, or a librdkafka key or value the client library refuses when
the daemon builds its clients (exit 2). It also says how much memory the daemon may
take with these settings (`sizing`), against the limit it will run under, and exits 2
when that does not fit: a unit whose `MemoryMax` is below it is killed under load.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from delayservice import sizing
from delayservice.cli.common import (
    BootstrapOption,
    ConfigOption,
    JsonOption,
    echo_json,
    fail,
    friendly_errors,
)
from delayservice.kafka.client_check import check_clients
from delayservice.redaction import redacted
from delayservice.settings import Settings
from delayservice.settings_loading import load_settings

MemoryMaxOption = Annotated[
    str | None,
    typer.Option(
        "--memory-max",
        help="The memory limit the daemon will run under, as systemd's MemoryMax or "
        "compose's mem_limit writes it (2G, 1800M, 512m). Default: this process's cgroup "
        "limit, when it has one.",
        envvar="DELAYSERVICE_CHECK_MEMORY_MAX",
    ),
]


@friendly_errors
def settings(
    config: ConfigOption = None,
    bootstrap_servers: BootstrapOption = None,
    as_json: JsonOption = False,
    memory_max: MemoryMaxOption = None,
) -> None:
    """Print every setting in force (librdkafka secrets shown as `<redacted>`) and, on
    stderr, the memory the daemon may take. Exit 2 and one line naming the setting when
    one is invalid, or a librdkafka client refuses it, or the memory does not fit."""
    limit = _limit(memory_max)
    current = load_settings(config, bootstrap_servers=bootstrap_servers)
    check_clients(current)
    shown = {
        name: redacted(value) if isinstance(value, dict) else value
        for name, value in current.model_dump(mode="json").items()
    }
    if as_json:
        echo_json(shown)
    else:
        for name, value in shown.items():
            typer.echo(f"{name} = {json.dumps(value)}")
    _memory(current, limit, "--memory-max" if memory_max else "this process's cgroup")


def _limit(memory_max: str | None) -> int | None:
    if memory_max is None:
        return sizing.cgroup_limit()
    try:
        return sizing.parse_size(memory_max)
    except ValueError as exc:
        raise fail(f"--memory-max: {exc}", 2) from None


def _memory(current: Settings, limit: int | None, source: str) -> None:
    bound = sizing.process_bound(current)
    worker = sizing.worker_bound(current)
    mib = sizing.MiB
    parts = (
        f"held records {worker.held // mib:,} MiB, client queues "
        f"{worker.client_queues // mib:,} MiB, idle {worker.idle // mib:,} MiB"
    )
    if current.processes > 1:
        parts = f"{current.processes} workers of: {parts}"
    where = "no limit known" if limit is None else f"limit {limit // mib:,} MiB ({source})"
    typer.echo(f"memory: the daemon may take {bound // mib:,} MiB ({parts}); {where}", err=True)
    if limit is not None and bound > limit:
        raise fail(
            f"the daemon may take {bound // mib:,} MiB with these settings, above the "
            f"{limit // mib:,} MiB limit ({source}): raise the limit, or lower "
            "max_buffered_bytes or the levels",
            2,
        )
