"""Options and error handling shared by every command.

Every failure a user can fix ends as one line on stderr: exit code 2 for bad settings
or topic setup, 1 for anything else DelayService reports.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final, ParamSpec, TypeVar

import typer
from confluent_kafka import KafkaError, KafkaException

from delayservice.delay_timing import delay_seconds
from delayservice.errors import ConfigError, DelayServiceError, TopicSetupError

if TYPE_CHECKING:
    from delayservice.settings import Settings

P = ParamSpec("P")
R = TypeVar("R")

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        envvar="DELAYSERVICE_CONFIG",
        help="TOML settings file.",
        show_default=False,
    ),
]
BootstrapOption = Annotated[
    str | None,
    typer.Option(
        "--bootstrap-servers",
        "-b",
        help="Kafka bootstrap servers "
        "(default: DELAYSERVICE_BOOTSTRAP_SERVERS or the config file).",
        show_default=False,
    ),
]


def local_endpoint(settings: Settings, path: str) -> str:
    """The URL of the daemon's HTTP endpoint `path` on this host, from the settings `run`
    listens by: `metrics_host` (a wildcard address is asked on loopback) and
    `metrics_port` (0, a port picked at start, cannot be known: exit 2)."""
    if settings.metrics_port == 0:
        raise fail("metrics_port is 0 (the daemon picks a free port): pass --url", 2)
    host = settings.metrics_host
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{settings.metrics_port}{path}"


def fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"delayservice: {message}", err=True)
    return typer.Exit(code)


DelayOption = Annotated[
    str | None,
    typer.Option(
        "--delay",
        "-d",
        help="From now: seconds (30, 1.5) or a duration (500ms, 30s, 5m, 2h, 1d), as "
        "the SDK's delay= takes them.",
        show_default=False,
    ),
]
AtOption = Annotated[
    datetime | None,
    typer.Option(
        "--at",
        "--deliver-at",
        help="Absolute time (ISO 8601; naive times are UTC). --deliver-at is the same "
        "flag, as the SDK's deliver_at=.",
        show_default=False,
    ),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Machine-readable output: JSON on stdout.")
]


def echo_json(data: object) -> None:
    typer.echo(json.dumps(data, sort_keys=True, default=str))


def delivery_time(
    delay: str | None, deliver_at: datetime | None, *, required: bool = False
) -> tuple[float | None, datetime | None]:
    """`--delay` in seconds and `--at` made aware (a naive time is UTC), as the
    producer takes them. Both, a delay that does not parse, or (`required`) neither
    exits 2 with a line naming the flags."""
    if (delay is not None and deliver_at is not None) or (
        required and delay is None and deliver_at is None
    ):
        raise fail("give one of --delay and --at", 2)
    try:
        delay_s = delay_seconds(delay) if delay is not None else None
    except ValueError as exc:
        raise fail(f"--delay: {exc}", 2) from None
    if deliver_at is not None and deliver_at.tzinfo is None:
        deliver_at = deliver_at.replace(tzinfo=UTC)
    return delay_s, deliver_at


CLIENT_SETTINGS: Final = "kafka, consumer or producer"
"""The settings whose keys go to librdkafka as they are: only librdkafka can refuse them."""


def kafka_failure(exc: KafkaException) -> typer.Exit:
    """A librdkafka refusal as one line: a configuration property it does not take (all
    the CLI's clients are configured from the settings) exits 2 like any bad setting."""
    error = exc.args[0] if exc.args else None
    text = error.str() if isinstance(error, KafkaError) else str(exc)
    about_config = any(word in text for word in ("configuration property", "ssl.", "sasl."))
    if isinstance(error, KafkaError) and error.code() == KafkaError._INVALID_ARG and about_config:
        return fail(f"invalid setting {CLIENT_SETTINGS}: {text}", 2)
    return fail(f"Kafka client: {text}", 1)


def friendly_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn DelayService errors into one line and an exit code instead of a traceback."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except (ConfigError, TopicSetupError) as exc:
            raise fail(str(exc), 2) from None
        except DelayServiceError as exc:
            raise fail(str(exc), 1) from None
        except KafkaException as exc:
            raise kafka_failure(exc) from None

    return wrapper


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
    )


class ProgressLine:
    """A count of records read, redrawn in place on stderr at most five times a second,
    for work whose total is not known up front; silent when not `enabled`."""

    def __init__(self, label: str, *, enabled: bool) -> None:
        self._label = label
        self._enabled = enabled
        self._count = 0
        self._drawn = 0.0

    def __enter__(self) -> ProgressLine:
        return self

    def add(self, count: int) -> None:
        self._count += count
        now = time.monotonic()
        if self._enabled and now - self._drawn >= 0.2:
            self._drawn = now
            sys.stderr.write(f"\r{self._label}: {self._count:,}")
            sys.stderr.flush()

    def __exit__(self, *_exc: object) -> None:
        if self._enabled and self._drawn:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
