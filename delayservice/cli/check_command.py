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

from delayservice.cli.common import (
    ConfigOption,
    JsonOption,
    echo_json,
    fail,
    friendly_errors,
    local_endpoint,
)
from delayservice.settings_loading import load_settings


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
    as_json: JsonOption = False,
) -> None:
    """Exit 0 when the daemon says it is ready, 1 otherwise (printing why)."""
    if not (math.isfinite(timeout) and timeout > 0):
        raise fail(f"--timeout: give a number of seconds above 0, not {timeout:g}", 2)
    if url is None:
        url = local_endpoint(load_settings(config), "/readyz")
    ready, answer = probe(url, timeout)
    if as_json:
        echo_json({"url": url, "ready": ready, "answer": answer})
    elif ready:
        typer.echo(answer)
    else:
        typer.echo(answer, err=True)
    if not ready:
        raise typer.Exit(1)


def probe(url: str, timeout: float) -> tuple[bool, str]:
    """Whether the endpoint answers 200, and what it (or the failure) said."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310  # operator-given URL
            return True, response.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return False, f"not ready: {exc.read().decode().strip()}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, f"not reachable: {url}: {exc}"
