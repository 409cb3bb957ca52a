"""A level record as it waits for its due time: the few values its forward needs.

The client's `Message` keeps a consumed record's headers in librdkafka's own list until
they are read (about 490 bytes for an envelope and one user header), and the garbage
collector visits it for as long as it is held. So the forwarder reads each record's
envelope once, when it admits the record into its partition's queue, and a record whose
envelope has the shape `DelayProducer` writes, on a topic stamped by the broker, is
kept as a plain tuple:

    (offset, due ms, target, value, key, user headers, delay-id, delay-ms, partitioner)

Every member is immutable, so after its first pass the collector stops visiting it, and
the `Message` with its headers is freed at once. Its forward is built from it without
another parse (`forward.sender`). Anything else (no envelope, another shape, a delay
this level does not hold, a record not stamped by the broker, unreadable headers) stays
the client's `Message` and takes the forwarder's full parse when it is due.

`forward.fast_path.hold_run` reads them, and sends them (`send_held_run`).
"""

from __future__ import annotations

from typing import Any, Final

from delayservice.envelope import H_DELAY_MS, H_ID, H_PARTITIONER, H_TARGET, H_VERSION

OFFSET: Final = 0
DUE: Final = 1
TARGET: Final = 2
VALUE: Final = 3
KEY: Final = 4
USER: Final = 5
ID: Final = 6
DELAY: Final = 7
PARTITIONER: Final = 8

Held = tuple[int, int, str, Any, Any, tuple[tuple[str, Any], ...], bytes, bytes, str | None]
"""See the module's docstring; a queue entry is a `Held` or the client's `Message`."""


def offset_of(entry: Any) -> int:
    """The level offset of a queue entry."""
    if type(entry) is tuple:
        return int(entry[OFFSET])
    return int(entry.offset() or 0)


def entry_bytes(entry: Any, allowance: int) -> int:
    """What a queue entry counts against the memory budget."""
    if type(entry) is tuple:
        value = entry[VALUE]
        return (len(value) if value is not None else 0) + allowance
    return len(entry) + allowance


def record_of(tp: tuple[str, int], entry: Any) -> Any:
    """A queue entry with a `Message`'s accessors, for the forwarder's slow paths."""
    return HeldView(tp, entry) if type(entry) is tuple else entry


class HeldView:
    """A `Held` seen as the record it was: what the full parse, dead letters and the
    failure rules read (`topic()`, `offset()`, `partition()`, `key()`, `value()`,
    `headers()`)."""

    __slots__ = ("_tp", "held")

    def __init__(self, tp: tuple[str, int], held: Held) -> None:
        self._tp = tp
        self.held = held

    @property
    def due_ms(self) -> int:
        return int(self.held[DUE])

    def offset(self) -> int:
        return int(self.held[OFFSET])

    def topic(self) -> str:
        return self._tp[0]

    def partition(self) -> int:
        return self._tp[1]

    def key(self) -> Any:
        return self.held[KEY]

    def value(self) -> Any:
        return self.held[VALUE]

    def error(self) -> None:
        return None

    def headers(self) -> list[tuple[str, Any]]:
        """The headers as they stood on the level topic."""
        held = self.held
        headers = [
            *held[USER],
            (H_VERSION, b"1"),
            (H_TARGET, held[TARGET].encode()),
            (H_DELAY_MS, held[DELAY]),
            (H_ID, held[ID]),
        ]
        if held[PARTITIONER] is not None:
            headers.append((H_PARTITIONER, held[PARTITIONER].encode()))
        return headers

    def set_headers(self, _headers: Any) -> None:
        """Nothing is cached here: the headers are rebuilt on every call."""

    def __len__(self) -> int:
        value = self.held[VALUE]
        return len(value) if value is not None else 0
