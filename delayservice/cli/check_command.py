"""`delayservice check`: a health probe for Docker, systemd or Kubernetes.

It reads the settings `run` reads (the config file, `DELAYSERVICE_*`), so the probe asks
where the daemon listens: `metrics_host` and `metrics_port`, as the image's HEALTHCHECK
relies on."""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from typing import Annotated

import typer

from delayservice.cli.common import ConfigOption, fail, friendly_errors, local_endpoint
from delayservice.settings import load_settings


@friendly_errors
def check(
    config: ConfigOption = None,
    url: Annotated[
        str | None,
        typer.Option(
            envvar="DELAYSERVICE_CHECK_URL",
            help="Readiness endpoint of the daemon (default: /readyz on metrics_host "
            "and metrics_port, where `run` listens).",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for an answer.")] = 5.0,
) -> None:
    """Exit 0 when the daemon says it is ready, 1 otherwise (printing why)."""
    if not (math.isfinite(timeout) and timeout > 0):
        raise fail(f"--timeout: give a number of seconds above 0, not {timeout:g}", 2)
    if url is None:
        url = local_endpoint(load_settings(config), "/readyz")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310  # operator-given URL
            typer.echo(response.read().decode().strip())
    except urllib.error.HTTPError as exc:
        typer.echo(f"not ready: {exc.read().decode().strip()}", err=True)
        raise typer.Exit(1) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        typer.echo(f"not reachable: {url}: {exc}", err=True)
        raise typer.Exit(1) from None
