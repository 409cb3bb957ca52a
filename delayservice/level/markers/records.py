"""What a queued level record says to the markers: its id, and which marker's move made
it (`delay-moved-by`, on a copy).

Apart from the worker's markers because the copy's mark is written by one of their
jobs (a move) and read by others (a verdict, a recall, a search), and it is a format.
"""

from __future__ import annotations

from typing import Any

from delayservice.envelope import H_ID, H_MOVED_BY
from delayservice.forward.held_record import ID
from delayservice.kafka.record_headers import read_headers
from delayservice.level.markers.verdict import LevelMarker, Order


def moved_by(marker: LevelMarker) -> bytes:
    return f"{marker.appended_ms}:{marker.partition}:{marker.offset}".encode()


def cursor_of(record: Any) -> Order | None:
    """Which marker made this copy (`delay-moved-by`), None for a message as first sent."""
    if type(record) is tuple:
        return None
    headers = read_headers(record)
    for name, value in headers if isinstance(headers, list) else ():
        if name == H_MOVED_BY and isinstance(value, bytes):
            parts = value.split(b":")
            if len(parts) == 3 and all(p.isdigit() for p in parts):
                return (int(parts[0]), int(parts[1]), int(parts[2]))
    return None


def id_of(record: Any) -> str | None:
    if type(record) is tuple:
        return bytes(record[ID]).decode("ascii", "replace")
    headers = read_headers(record)
    for name, value in headers if isinstance(headers, list) else ():
        if name == H_ID and isinstance(value, bytes):
            return value.decode("utf-8", "replace")
    return None
