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
| `delay-partitioner` | how the producer places keyed records (optional)   |
| `delay-partition` | explicit target partition, only when one was given    |
| `delay-due-ms`    | absolute due time, epoch ms, once it is known         |
| `delay-cancel`    | a cancel marker: its value is the delay-id to cancel  |
| `delay-reschedule`| a reschedule marker: its value is the delay-id to move  |
| `delay-moved-by`  | a moved level message's copy: the marker that moved it |

A reschedule marker also carries `delay-ms` (from its own append time) or
`delay-due-ms`: the new due time.

All values are UTF-8 text; numbers are decimal.
"""

from __future__ import annotations

import uuid
from typing import Final, NamedTuple, cast

from delayservice import partitioners
from delayservice.errors import EnvelopeError
from delayservice.topic_names import MAX_LENGTH as MAX_TOPIC_NAME

VERSION: Final = 1
PREFIX: Final = "delay-"
_PREFIX_LENGTH: Final = len(PREFIX)
H_VERSION: Final = "delay-v"
H_TARGET: Final = "delay-target"
H_DELAY_MS: Final = "delay-ms"
H_ID: Final = "delay-id"
H_PARTITION: Final = "delay-partition"
H_PARTITIONER: Final = "delay-partitioner"
"""The librdkafka partitioner of the producer that sent it (`partitioners`): the
daemon places a keyed record with it, where an undelayed send would land. Absent:
murmur2, the Java client's."""
H_DUE_MS: Final = "delay-due-ms"
H_CANCEL: Final = "delay-cancel"
"""A cancel marker: its value is the delay-id to cancel. A marker carries only this and
`delay-v`, with no key or value, so it is never mistaken for a message."""

H_RESCHEDULE: Final = "delay-reschedule"
"""A reschedule marker: its value is the delay-id to move, and `delay-ms` (from the
marker's append time) or `delay-due-ms` (epoch ms) the new due time. Like a cancel it
has no key or value."""

H_MOVED_BY: Final = "delay-moved-by"
"""On the copy of a level message a reschedule moved: `{append ms}:{partition}:{offset}`
of that marker on the markers topic. The markers after it belong to this copy
(`level.markers.verdict`)."""

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
    partitioner: str | None = None

    def headers(self) -> Headers:
        out: Headers = [
            (H_VERSION, str(self.version).encode()),
            (H_TARGET, self.target.encode()),
            (H_DELAY_MS, str(self.delay_ms).encode()),
            (H_ID, self.id.encode()),
        ]
        if self.partitioner is not None:
            out.append((H_PARTITIONER, self.partitioner.encode()))
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


PARTITIONER_NAMES: Final[dict[bytes, str]] = {name.encode(): name for name in partitioners.NAMES}
"""`delay-partitioner`'s values as they arrive, to the one string each."""

MAX_DIGITS: Final = 15
"""Numbers in the envelope have at most this many digits (epoch ms until year 33658)."""
MAX_PARTITION: Final = 2**31 - 1
_PREVIEW: Final = 40


def preview(text: str | bytes) -> str:
    """A short, printable rendering of a hostile value for an error message."""
    shown = repr(text[:_PREVIEW])
    return shown + (f"... ({len(text)} long)" if len(text) > _PREVIEW else "")


def _text(name: str, raw: bytes | str | None) -> str:
    if raw is None:
        raise EnvelopeError(f"header {name} has no value")
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise EnvelopeError(f"header {name} is not UTF-8") from exc


def _int(name: str, raw: bytes | str | None, minimum: int, maximum: int) -> int:
    """Plain ASCII decimal only: `int()` would also take ' 7', '1_000' and other scripts'
    digits, and a producer that sends those is not speaking this envelope."""
    text = _text(name, raw)
    if not (text.isascii() and text.isdigit()) or len(text) > MAX_DIGITS:
        raise EnvelopeError(f"header {name} is not a decimal number: {preview(text)}")
    value = int(text)
    if not minimum <= value <= maximum:
        raise EnvelopeError(f"header {name} must be in [{minimum}, {maximum}], got {value}")
    return value


def _fast_int(raw: bytes | str | None) -> int:
    """The common case's parse; anything unusual raises and goes to `_checked`."""
    if type(raw) is bytes and raw.isdigit() and len(raw) <= MAX_DIGITS:
        return int(raw)
    raise ValueError


_TARGET_NAMES: dict[bytes, str] = {}
"""Decoded target names, so the many records held for one target share one string."""
_MAX_TARGET_NAMES = 10_000


def _target_name(raw: bytes) -> str:
    name = raw.decode()
    if len(raw) > MAX_TOPIC_NAME:
        return name  # never a topic (it is dead-lettered): not worth keeping, and huge
    if len(_TARGET_NAMES) >= _MAX_TARGET_NAMES:
        _TARGET_NAMES.clear()  # names come from records: keep the memo bounded
    _TARGET_NAMES[raw] = name
    return name


def unwrap(headers: Headers | None) -> tuple[Envelope, Headers, int]:
    """Split a delay-topic record's headers into its envelope and the user's headers.

    Also returns the headers' size in bytes, counted in the same single pass because
    this runs once per record on the daemon's hot path. Raises `EnvelopeError` with a
    reason fit for the dead-letter topic, and nothing else, whatever the headers hold.
    """
    env: dict[str, bytes | str | None] = {}
    user: Headers = []
    size = 0
    for name, value in headers or ():
        size += len(name) + (len(value) if value else 0)
        if name.startswith(PREFIX):
            if name in env:
                raise EnvelopeError(f"header {preview(name)} appears twice")
            env[name] = value
        else:
            user.append((name, value))
    try:  # the common, valid case without per-field messages
        if env[H_VERSION] == b"1":
            raw_target = env[H_TARGET]
            target = _TARGET_NAMES.get(raw_target)  # type: ignore[arg-type]
            if target is None:
                target = _target_name(raw_target)  # type: ignore[arg-type]
            message_id = env[H_ID].decode()  # type: ignore[union-attr]
            delay_ms = _fast_int(env[H_DELAY_MS])
            partition = _fast_int(env[H_PARTITION]) if H_PARTITION in env else None
            due_ms = _fast_int(env[H_DUE_MS]) if H_DUE_MS in env else None
            partitioner = PARTITIONER_NAMES[env[H_PARTITIONER]] if H_PARTITIONER in env else None  # type: ignore[index]
            if target and message_id and (partition is None or partition <= MAX_PARTITION):
                envelope = Envelope(
                    target, delay_ms, message_id, partition, due_ms, VERSION, partitioner
                )
                return envelope, user, size
    except Exception:  # noqa: S110  # any surprise: the checked path names it
        pass
    return _checked(env), user, size


ByteHeaders = list[tuple[str, bytes | None]]
"""Headers as the client returns them from a consumed record."""
PlainTail = tuple[str, int, str, "int | None", ByteHeaders, "str | None"]
"""(target, delay ms, id, due ms or None, the user's headers, partitioner or None) of a
plain envelope."""


def plain_tail(headers: object) -> PlainTail | None:
    """The envelope as `wrap` writes it without a target partition, read from the end
    of `headers`: `delay-v` 1, `delay-target`, `delay-ms`, `delay-id`, optionally
    `delay-partitioner`, optionally `delay-due-ms`, after user headers none of which
    uses the prefix and whose values are bytes or None. None for anything else, which
    `unwrap` then parses in full and names what is wrong; a record this accepts,
    `unwrap` reads the same way.

    It runs once per record the precise intake reads, where `unwrap`'s dictionary of
    fields cost a seventh of the thread. The level forwarder's fast path
    (`RecordSender.send_run`) makes the same checks inline: calling this from there cost
    0.05-0.10 of the bare pipe's rate (0.44-0.47 against 0.52-0.54 at-least-once, runs
    alternated), so the two copies stay, and must keep agreeing
    (`tests/forward/test_fast_path_agreement.py` checks that they do)."""
    if type(headers) is not list:
        return None
    count = len(headers)
    end = count
    due_ms = None
    partitioner = None
    if count >= 5 and headers[-1][0] == H_DUE_MS:
        raw_due = headers[-1][1]
        if not (type(raw_due) is bytes and raw_due.isdigit() and len(raw_due) <= MAX_DIGITS):
            return None
        due_ms = int(raw_due)
        end = count - 1
    if end >= 5 and headers[end - 1][0] == H_PARTITIONER:
        partitioner = PARTITIONER_NAMES.get(headers[end - 1][1])
        if partitioner is None:
            return None
        end -= 1
    if end < 4:
        return None
    (v, version), (t, raw_target), (m, raw_ms), (i, raw_id) = headers[end - 4 : end]
    if not (
        v == H_VERSION
        and t == H_TARGET
        and m == H_DELAY_MS
        and i == H_ID
        and version == b"1"
        and type(raw_ms) is bytes
        and raw_ms.isdigit()
        and len(raw_ms) <= MAX_DIGITS
        and type(raw_id) is bytes
        and raw_id
        and raw_id.isascii()
        and type(raw_target) is bytes
        and raw_target
    ):
        return None
    user = headers[: end - 4]
    for name, value in user:
        if type(name) is not str or name[:_PREFIX_LENGTH] == PREFIX:
            return None
        if value is not None and type(value) is not bytes:
            return None
    target = _TARGET_NAMES.get(raw_target)
    if target is None:
        try:
            target = _target_name(raw_target)
        except UnicodeDecodeError:
            return None
    return (
        target,
        int(raw_ms),
        raw_id.decode("ascii"),
        due_ms,
        cast("ByteHeaders", user),
        partitioner,
    )


def _checked(env: dict[str, bytes | str | None]) -> Envelope:
    """Validate field by field, so the error names exactly what is wrong."""
    if H_VERSION not in env:
        raise EnvelopeError("no envelope: header delay-v is missing")
    version = _int(H_VERSION, env[H_VERSION], 0, 10**MAX_DIGITS)
    if version != VERSION or env[H_VERSION] not in (b"1", "1"):
        raise EnvelopeError(
            f"envelope version {preview(env[H_VERSION] or b'')} is not supported "
            f"(this daemon reads {VERSION})"
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
    biggest = 10**MAX_DIGITS - 1
    return Envelope(
        target=target,
        delay_ms=_int(H_DELAY_MS, env[H_DELAY_MS], 0, biggest),
        id=message_id,
        partition=(
            _int(H_PARTITION, env[H_PARTITION], 0, MAX_PARTITION) if H_PARTITION in env else None
        ),
        due_ms=_int(H_DUE_MS, env[H_DUE_MS], 0, biggest) if H_DUE_MS in env else None,
        version=version,
        partitioner=_partitioner(env[H_PARTITIONER]) if H_PARTITIONER in env else None,
    )


def _partitioner(raw: bytes | str | None) -> str:
    name = _text(H_PARTITIONER, raw)
    if name not in PARTITIONER_NAMES.values():
        raise EnvelopeError(
            f"header {H_PARTITIONER} names no partitioner: {preview(name)} "
            f"(one of {', '.join(sorted(PARTITIONER_NAMES.values()))})"
        )
    return name


def forwarded_headers(user_headers: Headers, envelope: Envelope, due_ms: int) -> Headers:
    """Headers of the record on the real topic: the user's, plus id and due time for audit."""
    return [*user_headers, (H_ID, envelope.id.encode()), (H_DUE_MS, str(due_ms).encode())]
