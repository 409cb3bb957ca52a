"""One precise record in memory: read from the precise topic or loaded from a slot file.

It answers the accessors of a confluent `Message` that the forwarder and its failure
rules use (`offset()`, `partition()`, `key()`, `value()`, `headers()`), so precise
records go through the same sender and commit points as a level's records. Its
envelope is read once, when the record is admitted or framed: the send path uses it
as it is, and `headers()` (the headers as they stood on the precise topic) is rebuilt
only for the slow path (a dead letter, a refusal to place).
"""

from __future__ import annotations

from typing import Any

from delayservice.envelope import H_PARTITIONER, PARTITIONER_NAMES, Envelope, Headers
from delayservice.precise.storage.slot_file import StoredRecord


def stored_headers(
    user: list[tuple[str, bytes | None]], partitioner: str | None
) -> list[tuple[str, bytes | None]]:
    """The headers a slot file keeps of a record: the user's, and the envelope's
    `delay-partitioner` after them when there is one (no user header may use the
    `delay-` prefix, so it cannot be taken for one; `SlotRecord.stored` takes it back)."""
    if partitioner is None:
        return user
    return [*user, (H_PARTITIONER, partitioner.encode())]


class SlotRecord:
    __slots__ = ("_key", "_offset", "_partition", "_value", "due_ms", "envelope", "problem",
                 "slot", "user")  # fmt: skip

    def __init__(
        self,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        user: Headers,
        envelope: Envelope | None,
        due_ms: int,
        slot: Any,
        problem: tuple[str, str] | None = None,
    ) -> None:
        self._partition = partition
        self._offset = offset
        self._key = key
        self._value = value
        self.user = user
        """The user's headers when the envelope is valid; all headers as read when not."""
        self.envelope = envelope
        self.due_ms = due_ms
        self.slot = slot
        """What settles it once it is durable: its slot's tracker when it was framed into
        a slot file, else the intake's offset ledger entry of its partition."""
        self.problem = problem
        """(reason, detail) when it can only be dead-lettered (decided at admission)."""

    @classmethod
    def stored(cls, item: StoredRecord, partition: int, slot: Any) -> SlotRecord:
        """A record loaded from a slot file (`stored_headers` wrote its headers)."""
        user: Headers = list(item.headers)
        partitioner = None
        if user and user[-1][0] == H_PARTITIONER:
            raw = user.pop()[1]
            partitioner = PARTITIONER_NAMES.get(raw) if isinstance(raw, bytes) else None
        return cls(
            partition,
            item.offset,
            item.key,
            item.value,
            user,
            Envelope(
                item.target,
                item.delay_ms,
                item.message_id,
                item.target_partition,
                partitioner=partitioner,
            ),
            item.due_ms,
            slot,
        )

    # -- a Message's accessors -----------------------------------------------------
    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> Headers:
        """The headers as they stood on the precise topic (dead letters keep them)."""
        if self.envelope is None:
            return list(self.user)
        return [*self.user, *self.envelope.headers()]
