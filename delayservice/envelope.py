"""The envelope: what a delayed record carries in its headers, version 1.

Key, value and user headers travel untouched; the envelope rides beside them in
headers whose names all start with `delay-`, so consumers of the real topic that do
not care can ignore them. On forward, `delay-id` and `delay-due-ms` stay on the record
so an audit can match both sides.

| header            | meaning                                               |
| ----------------- | ----------------------------------------------------- |
| `delay-v`         | envelope version (`1`)                                |
| `delay-target`    | the real topic                                        |
| `delay-ms`        | the requested delay in milliseconds                   |
| `delay-id`        | unique message id (de-duplication, cancel, audit)     |
| `delay-partition` | explicit target partition, only when one was given    |
| `delay-due-ms`    | absolute due time, epoch ms, once it is known         |

All values are UTF-8 text; numbers are decimal.
"""

from __future__ import annotations

import uuid
from typing import Final, NamedTuple

from delayservice.errors import EnvelopeError

VERSION: Final = 1
PREFIX: Final = "delay-"
H_VERSION: Final = "delay-v"
H_TARGET: Final = "delay-target"
H_DELAY_MS: Final = "delay-ms"
H_ID: Final = "delay-id"
H_PARTITION: Final = "delay-partition"
H_DUE_MS: Final = "delay-due-ms"

Headers = list[tuple[str, str | bytes | None]]
"""Headers in the list form confluent-kafka accepts and returns."""


def new_id() -> str:
    return uuid.uuid4().hex


class Envelope(NamedTuple):
    """Immutable; a NamedTuple because one is built per record on the hot path."""

    target: str
    delay_ms: int
    id: str
    partition: int | None = None
    due_ms: int | None = None
    version: int = VERSION

    def headers(self) -> Headers:
        out: Headers = [
            (H_VERSION, str(self.version).encode()),
            (H_TARGET, self.target.encode()),
            (H_DELAY_MS, str(self.delay_ms).encode()),
            (H_ID, self.id.encode()),
        ]
        if self.partition is not None:
            out.append((H_PARTITION, str(self.partition).encode()))
        if self.due_ms is not None:
            out.append((H_DUE_MS, str(self.due_ms).encode()))
        return out


def wrap(envelope: Envelope, user_headers: Headers | None) -> Headers:
    """User headers first, envelope after; user headers named `delay-*` are refused."""
    user = list(user_headers or [])
    for name, _ in user:
        if name.startswith(PREFIX):
            raise EnvelopeError(f"header {name!r} uses the reserved prefix {PREFIX!r}")
    return user + envelope.headers()


def _text(name: str, raw: bytes | str | None) -> str:
    if raw is None:
        raise EnvelopeError(f"header {name} has no value")
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise EnvelopeError(f"header {name} is not UTF-8") from exc


def _int(name: str, raw: bytes | str | None, minimum: int) -> int:
    text = _text(name, raw)
    try:
        value = int(text)
    except ValueError as exc:
        raise EnvelopeError(f"header {name} is not an integer: {text!r}") from exc
    if value < minimum:
        raise EnvelopeError(f"header {name} must be at least {minimum}, got {value}")
    return value


def unwrap(headers: Headers | None) -> tuple[Envelope, Headers, int]:
    """Split a delay-topic record's headers into its envelope and the user's headers.

    Also returns the headers' size in bytes, counted in the same single pass because
    this runs once per record on the daemon's hot path. Raises `EnvelopeError` with a
    reason fit for the dead-letter topic.
    """
    env: dict[str, bytes | str | None] = {}
    user: Headers = []
    size = 0
    for name, value in headers or ():
        size += len(name) + (len(value) if value else 0)
        if name.startswith(PREFIX):
            if name in env:
                raise EnvelopeError(f"header {name} appears twice")
            env[name] = value
        else:
            user.append((name, value))
    try:  # the common, valid case without per-field checks
        if env[H_VERSION] == b"1":
            target = env[H_TARGET].decode()  # type: ignore[union-attr]
            message_id = env[H_ID].decode()  # type: ignore[union-attr]
            delay_ms = int(env[H_DELAY_MS])  # type: ignore[arg-type]
            partition = int(env[H_PARTITION]) if H_PARTITION in env else None  # type: ignore[arg-type]
            due_ms = int(env[H_DUE_MS]) if H_DUE_MS in env else None  # type: ignore[arg-type]
            if (
                target
                and message_id
                and delay_ms >= 0
                and (partition is None or partition >= 0)
                and (due_ms is None or due_ms >= 0)
            ):
                return Envelope(target, delay_ms, message_id, partition, due_ms), user, size
    except (KeyError, AttributeError, ValueError):
        pass
    return _checked(env), user, size


def _checked(env: dict[str, bytes | str | None]) -> Envelope:
    """Validate field by field, so the error names exactly what is wrong."""
    if H_VERSION not in env:
        raise EnvelopeError("no envelope: header delay-v is missing")
    version = _int(H_VERSION, env[H_VERSION], 1)
    if version != VERSION:
        raise EnvelopeError(
            f"envelope version {version} is not supported (this daemon reads {VERSION})"
        )
    for required in (H_TARGET, H_DELAY_MS, H_ID):
        if required not in env:
            raise EnvelopeError(f"header {required} is missing")
    target = _text(H_TARGET, env[H_TARGET])
    if not target:
        raise EnvelopeError("header delay-target is empty")
    message_id = _text(H_ID, env[H_ID])
    if not message_id:
        raise EnvelopeError("header delay-id is empty")
    return Envelope(
        target=target,
        delay_ms=_int(H_DELAY_MS, env[H_DELAY_MS], 0),
        id=message_id,
        partition=_int(H_PARTITION, env[H_PARTITION], 0) if H_PARTITION in env else None,
        due_ms=_int(H_DUE_MS, env[H_DUE_MS], 0) if H_DUE_MS in env else None,
        version=version,
    )


def forwarded_headers(user_headers: Headers, envelope: Envelope, due_ms: int) -> Headers:
    """Headers of the record on the real topic: the user's, plus id and due time for audit."""
    return [*user_headers, (H_ID, envelope.id.encode()), (H_DUE_MS, str(due_ms).encode())]
