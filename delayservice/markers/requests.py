"""What a marker asks, read from its headers: both modes' readers and `find` agree on it.

A marker is a record with no key or value whose headers ask something of a message
that may still be hours from due: `delay-cancel: <id>` to call it off,
`delay-reschedule: <id>` (with `delay-ms` or `delay-due-ms`) to move it.
"""

from __future__ import annotations

from delayservice.envelope import H_CANCEL, H_DELAY_MS, H_DUE_MS, H_RESCHEDULE, MAX_DIGITS, Headers


def cancel_target(headers: Headers) -> str | None:
    """The id a cancel marker names, or None when the record is not one."""
    for name, value in headers:
        if name == H_CANCEL:
            if isinstance(value, bytes):
                return value.decode("utf-8", "replace")
            return value or ""
    return None


class BadMarkerError(ValueError):
    """A reschedule marker that says no id, or no new time, or one that is not a number."""


def reschedule_request(headers: Headers) -> tuple[str, int | None, int | None] | None:
    """(id, delay ms, due ms) a reschedule marker asks for, or None when the record is
    not one. Raises `BadMarkerError` for a marker that cannot be read."""
    fields: dict[str, str | bytes | None] = {}
    for name, value in headers:
        if name in (H_RESCHEDULE, H_DELAY_MS, H_DUE_MS) and name not in fields:
            fields[name] = value
    if H_RESCHEDULE not in fields:
        return None
    raw_id = fields[H_RESCHEDULE]
    message_id = raw_id.decode("utf-8", "replace") if isinstance(raw_id, bytes) else raw_id
    if not message_id:
        raise BadMarkerError("a reschedule marker without an id")
    numbers: list[int | None] = []
    for name in (H_DELAY_MS, H_DUE_MS):
        raw = fields.get(name)
        text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
        if text is None and name not in fields:
            numbers.append(None)
        elif text is None or not text.isdigit() or not text.isascii() or len(text) > MAX_DIGITS:
            raise BadMarkerError(f"{name} of a reschedule marker is not a number: {text!r}")
        else:
            numbers.append(int(text))
    if numbers == [None, None]:
        raise BadMarkerError(f"a reschedule marker needs {H_DELAY_MS} or {H_DUE_MS}")
    return message_id, numbers[0], numbers[1]


def reschedule_target(headers: Headers) -> str:
    """The id a reschedule marker names, as far as it can be read (for its reply)."""
    for name, value in headers:
        if name == H_RESCHEDULE:
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else value or ""
    return ""
