"""One record held by a level worker between consume and acknowledgement."""

from __future__ import annotations

from dataclasses import dataclass

from delayservice.envelope import Envelope, Headers, forwarded_headers
from delayservice.worker.ledger import PartitionLedger


@dataclass(slots=True, eq=False)
class HeldRecord:
    ledger: PartitionLedger
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    """The user's headers when the envelope is valid; all headers as read when it is not."""
    size: int
    envelope: Envelope | None
    """None when the record had no valid envelope."""
    due_ms: int
    attempts: int = 0
    dead_letter: tuple[str, str] | None = None
    """(reason, detail) once the record is bound for the dead-letter topic."""
    first_failure: float | None = None
    """Monotonic time of the first failed attempt, for giving up (`retries_exhausted`)."""
    failed_partition: int = -1
    """The target partition of the last failed attempt, when the client knew it."""
    stub: bool = False
    """Dead-letter a payload-free stub: the full copy did not fit."""

    def forward_headers(self) -> Headers:
        assert self.envelope is not None
        return forwarded_headers(self.headers, self.envelope, self.due_ms)

    def original_headers(self) -> Headers:
        """The headers as they stood on the delay topic, for the dead-letter copy."""
        if self.envelope is None:
            return self.headers
        return [*self.headers, *self.envelope.headers()]


def record_size(key: bytes | None, value: bytes | None, headers: Headers | None) -> int:
    """Bytes of payload a record pins in memory (Python object overhead comes on top)."""
    size = (len(key) if key else 0) + (len(value) if value else 0)
    for name, header_value in headers or ():
        size += len(name) + (len(header_value) if header_value else 0)
    return size
