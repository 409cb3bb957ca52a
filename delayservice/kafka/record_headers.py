"""Reading a consumed record's headers without letting hostile bytes crash the process.

confluent-kafka decodes header *names* as UTF-8. For a name that is not valid UTF-8 (any
client outside Python can write one), `Message.headers()` returns, and caches on the
message, a list holding a tuple with a NULL where the name should be, *with the
decoding error still set*. Touching that tuple, or a second `headers()` call, segfaults
the interpreter. Whether the caller even sees an error depends on the call site:

- a plain `record.headers()` is checked by CPython (SystemError "returned a result with
  an exception set") only until the interpreter specializes the call site; in a hot loop
  it then returns the poisoned list silently, and the pending UnicodeDecodeError pops up
  at some unrelated later call (measured here: 200 of 200 poisoned records returned
  silently from a loop, none raised);
- a call through `operator.methodcaller`, or through `map`, goes through a C call path
  that always checks, so it raises SystemError every time (200 of 200).

So every place that reads a consumed record's headers makes a checked call inside a
`try`, through `read_headers` (or `headers_of_run` for a whole run of records): on
failure it replaces the poisoned cache with `UNREADABLE` (`set_headers` drops the old
list safely), so even a later stray `headers()` call returns an empty, harmless value.

Names containing NUL cannot be seen at all: the client reads them as C strings and
truncates them at the NUL, so such a name reaches Python (and is forwarded) shortened.
"""

from __future__ import annotations

import logging
import operator
from typing import Any, Final, cast

from confluent_kafka import Message

from delayservice.envelope import Headers

log = logging.getLogger(__name__)

RawHeaders = Headers


class UnreadableHeaders(tuple[()]):
    """An empty, immutable stand-in for headers the client could not decode.

    It is a tuple, not a list, so code that looks for the client's own list (`type(h)
    is list`) never mistakes it for real headers, and nothing can append to it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNREADABLE"


UNREADABLE: Final = UnreadableHeaders()

_headers_of: Final = operator.methodcaller("headers")
_HEADERS: Final = Message.headers
"""`record.headers()` through a call CPython always checks for a pending error: never call
`headers()` directly on a consumed record (see the module's docstring)."""


def headers_of_run(records: list[Any]) -> list[Any]:
    """`read_headers` of each record, for a hot loop: `map` calls the client's method
    through a checked call too, at about 50 ns a record where `read_headers` costs about
    200. The record whose call raised is the one after those read: it is neutralized,
    never called again (a second call would return its poisoned list silently)."""
    heads: list[Any] = []
    start = 0
    while start < len(records):
        try:
            heads.extend(map(_HEADERS, records[start:]))  # keeps what it read before a raise
        except Exception:  # an undecodable record, or not the client's Message
            failed = records[len(heads)]
            heads.append(
                read_headers(failed) if type(failed) is not Message else unreadable(failed)
            )
        start = len(heads)
    return heads


def read_headers(record: Any) -> RawHeaders | UnreadableHeaders | None:
    """The record's headers as the client gives them (a list, or None), or `UNREADABLE`.

    Call it once per record and keep the result: it is the only safe way to learn that a
    record's headers cannot be read."""
    try:
        headers = _headers_of(record)
    except Exception:  # SystemError from the client, or anything a surprise raises
        return unreadable(record)
    # A record read once already returns UNREADABLE itself, so identity checks hold.
    return cast("RawHeaders | UnreadableHeaders | None", headers)


def unreadable(record: Any) -> UnreadableHeaders:
    """Mark a record whose checked `headers()` call just raised: its poisoned cache is
    replaced, so no later call can touch it."""
    try:
        record.set_headers(UNREADABLE)
    except Exception:  # a record type without set_headers: nothing cached to poison
        log.debug("record of type %s keeps its headers cache", type(record).__name__)
    return UNREADABLE


def readable_headers(record: Any) -> RawHeaders:
    """The record's headers as a list: empty when it has none or they cannot be decoded
    (a dead letter of such a record carries none of them)."""
    headers = read_headers(record)
    return headers if isinstance(headers, list) else []


def header_values(record: Any) -> dict[str, bytes]:
    """The record's headers by name, for readers of what DelayService itself wrote (the
    demo, the benchmarks, the tools): the last of a repeated name wins, a null value is
    left out, and unreadable headers read as none."""
    return {
        name: value if isinstance(value, bytes) else str(value).encode()
        for name, value in readable_headers(record)
        if value is not None
    }
