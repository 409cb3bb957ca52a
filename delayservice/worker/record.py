"""One record held by a level worker between consume and acknowledgement."""

from __future__ import annotations

from dataclasses import dataclass

from delayservice.envelope import Envelope, Headers, forwarded_headers
from delayservice.worker.ledger import PartitionLedger


class Retries:
    """What only a record that failed needs; most records never get one."""

    __slots__ = ("attempts", "failed_partition", "first_failure", "stub")

    def __init__(self) -> None:
        self.attempts = 0
        self.first_failure: float | None = None
        self.failed_partition = -1
        self.stub = False


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
    dead_letter: tuple[str, str] | None = None
    """(reason, detail) once the record is bound for the dead-letter topic."""
    retries: Retries | None = None
    """Made on the first failure: held records are many, failing ones few."""

    def _retries(self) -> Retries:
        if self.retries is None:
            self.retries = Retries()
        return self.retries

    @property
    def attempts(self) -> int:
        return 0 if self.retries is None else self.retries.attempts

    @attempts.setter
    def attempts(self, value: int) -> None:
        self._retries().attempts = value

    @property
    def first_failure(self) -> float | None:
        """Monotonic time of the first failed attempt, for giving up (`retries_exhausted`)."""
        return None if self.retries is None else self.retries.first_failure

    @first_failure.setter
    def first_failure(self, value: float | None) -> None:
        self._retries().first_failure = value

    @property
    def failed_partition(self) -> int:
        """The target partition of the last failed attempt, when the client knew it."""
        return -1 if self.retries is None else self.retries.failed_partition

    @failed_partition.setter
    def failed_partition(self, value: int) -> None:
        self._retries().failed_partition = value

    @property
    def stub(self) -> bool:
        """Dead-letter a payload-free stub: the full copy did not fit."""
        return self.retries is not None and self.retries.stub

    @stub.setter
    def stub(self, value: bool) -> None:
        self._retries().stub = value

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
