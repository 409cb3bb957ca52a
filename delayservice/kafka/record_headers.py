"""Reading a consumed record's headers without letting hostile bytes crash the process.

confluent-kafka decodes header *names* as UTF-8. A name that is not valid UTF-8 (any
client outside Python can write one) makes `Message.headers()` raise `SystemError` and
leaves a cached list holding a NULL where the name should be; a second `headers()`
call, or touching that list, segfaults the interpreter. So every place that reads a
consumed record's headers goes through `read_headers`: it calls `headers()` once, and
on failure replaces the poisoned cache with `UNREADABLE` (`set_headers` drops the old
list safely), so even a later stray `headers()` call returns an empty, harmless value.

Names containing NUL cannot be seen at all: the client reads them as C strings and
truncates them at the NUL, so such a name reaches Python (and is forwarded) shortened.
"""

from __future__ import annotations

import logging
from typing import Any, Final, cast

log = logging.getLogger(__name__)

RawHeaders = list[tuple[str, bytes | None]]


class UnreadableHeaders(tuple[()]):
    """An empty, immutable stand-in for headers the client could not decode.

    It is a tuple, not a list, so code that looks for the client's own list (`type(h)
    is list`) never mistakes it for real headers, and nothing can append to it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNREADABLE"


UNREADABLE: Final = UnreadableHeaders()


def read_headers(record: Any) -> RawHeaders | UnreadableHeaders | None:
    """The record's headers as the client gives them (a list, or None), or `UNREADABLE`.

    Call it once per record and keep the result: it is the only safe way to learn that a
    record's headers cannot be read."""
    try:
        headers = record.headers()
    except Exception:  # SystemError from the client, or anything a surprise raises
        _neutralize(record)
        return UNREADABLE
    # A record read once already returns UNREADABLE itself, so identity checks hold.
    return cast("RawHeaders | UnreadableHeaders | None", headers)


def _neutralize(record: Any) -> None:
    try:
        record.set_headers(UNREADABLE)
    except Exception:  # a record type without set_headers: nothing cached to poison
        log.debug("record of type %s keeps its headers cache", type(record).__name__)


def header_values(record: Any) -> dict[str, bytes]:
    """The record's headers by name, for readers of what DelayService itself wrote (the
    demo, the benchmarks, the tools): the last of a repeated name wins, a null value is
    left out, and unreadable headers read as none."""
    headers = read_headers(record)
    if not isinstance(headers, list):
        return {}
    return {
        name: value if isinstance(value, bytes) else str(value).encode()
        for name, value in headers
        if value is not None
    }
