"""One record held by a level worker between consume and acknowledgement."""

from __future__ import annotations

from dataclasses import dataclass

from delayservice.envelope import PREFIX, Envelope, Headers, forwarded_headers
from delayservice.worker.ledger import PartitionLedger


@dataclass(slots=True, eq=False)
class HeldRecord:
    ledger: PartitionLedger
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    """The record's headers as read from the delay topic, envelope included."""
    size: int
    envelope: Envelope | None
    """None when the record had no valid envelope."""
    due_ms: int
    attempts: int = 0
    dead_letter: tuple[str, str] | None = None
    """(reason, detail) once the record is bound for the dead-letter topic."""

    def forward_headers(self) -> Headers:
        assert self.envelope is not None
        user = [(n, v if v is not None else b"") for n, v in self.headers if not n.startswith(PREFIX)]
        return forwarded_headers(user, self.envelope, self.due_ms)


def record_size(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]] | None) -> int:
    """Bytes of payload a record pins in memory (Python object overhead comes on top)."""
    size = (len(key) if key else 0) + (len(value) if value else 0)
    for name, header_value in headers or ():
        size += len(name) + (len(header_value) if header_value else 0)
    return size
