"""`delayservice check`: a health probe for Docker, systemd or Kubernetes."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Annotated

import typer


def check(
    url: Annotated[
        str, typer.Option(envvar="DELAYSERVICE_CHECK_URL", help="Readiness endpoint of the daemon.")
    ] = "http://127.0.0.1:9480/readyz",
    timeout: Annotated[float, typer.Option(help="Seconds to wait for an answer.")] = 5.0,
) -> None:
    """Exit 0 when the daemon says it is ready, 1 otherwise (printing why)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310  # operator-given URL
            typer.echo(response.read().decode().strip())
    except urllib.error.HTTPError as exc:
        typer.echo(f"not ready: {exc.read().decode().strip()}", err=True)
        raise typer.Exit(1) from None
    except (urllib.error.URLError, OSError) as exc:
        typer.echo(f"not reachable: {url}: {exc}", err=True)
        raise typer.Exit(1) from None
