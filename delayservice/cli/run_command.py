"""`delayservice run`: the daemon in the foreground, stopped by SIGTERM or SIGINT."""

from __future__ import annotations

import faulthandler
import logging
from typing import Annotated

import typer

from delayservice.cli.common import (
    BootstrapOption,
    ConfigOption,
    friendly_errors,
    setup_logging,
)
from delayservice.daemon import Daemon, install_signal_handlers, tune_garbage_collector
from delayservice.settings_loading import load_settings
from delayservice.supervisor import Supervisor

log = logging.getLogger(__name__)


@friendly_errors
def run(
    config: ConfigOption = None,
    bootstrap_servers: BootstrapOption = None,
    levels: Annotated[
        str | None, typer.Option(help="Delay levels, e.g. 5s,1m,2h.", show_default=False)
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Port of /metrics, /healthz, /readyz.", show_default=False)
    ] = None,
) -> None:
    """Run the forwarding daemon beside a broker until SIGTERM or SIGINT."""
    settings = load_settings(
        config, bootstrap_servers=bootstrap_servers, levels=levels, metrics_port=metrics_port
    )
    setup_logging(settings.log_level)
    # A crash inside a client library (SIGSEGV, SIGABRT) would end the process with no
    # word of where: every thread's Python stack goes to stderr (the journal) first.
    faulthandler.enable()
    daemon: Daemon | Supervisor = (
        Supervisor(settings) if settings.processes > 1 else Daemon(settings)
    )
    install_signal_handlers(daemon)
    if isinstance(daemon, Daemon):
        tune_garbage_collector()  # the supervisor holds no records
    try:
        daemon.start()
    except Exception:
        daemon.stop()
        raise
    log.info("metrics on http://%s:%s/metrics", settings.metrics_host, daemon.metrics_port)
    raise typer.Exit(daemon.wait())
