"""Which offset of the precise topic is safe to commit.

The promise "nothing lost" rests here: an offset is committable only when every
record at or below it is durable (its slot write synced, or its dead letter made
durable by the forwarder's commit point). Offsets are tracked in offset order, so
settling is O(1) amortised: the head of the pending deque moves forward once its
settled set catches up.

The intake thread tracks and settles what its syncs made durable; the forwarder's
commit points settle dead letters; a single lock keeps the two consistent.
"""

from __future__ import annotations

import threading
from collections import deque


class PartitionLedger:
    __slots__ = (
        "buffered",
        "bytes",
        "last_committed",
        "next_offset",
        "partition",
        "pending",
        "revoked",
        "settled",
    )

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.pending: deque[int] = deque()
        self.settled: set[int] = set()
        self.next_offset: int | None = None
        self.last_committed: int | None = None
        self.buffered = 0
        self.bytes = 0
        self.revoked = False

    def committable(self) -> int | None:
        """The offset to commit: the first unsettled record, or the next one to read."""
        pending, settled = self.pending, self.settled
        while pending and pending[0] in settled:
            settled.discard(pending.popleft())
        if pending:
            return pending[0]
        return self.next_offset


class LevelLedger:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.partitions: dict[int, PartitionLedger] = {}
        self.total_buffered = 0
        self.total_bytes = 0
        self.peak_partition_buffered = 0

    def assign(self, partition: int) -> PartitionLedger:
        with self.lock:
            ledger = PartitionLedger(partition)
            self.partitions[partition] = ledger
            return ledger

    def revoke(self, partition: int) -> PartitionLedger | None:
        """Forget a partition; its buffered records no longer count and late acks are ignored."""
        with self.lock:
            ledger = self.partitions.pop(partition, None)
            if ledger is not None:
                ledger.revoked = True
                self.total_buffered -= ledger.buffered
                self.total_bytes -= ledger.bytes
            return ledger

    def track(self, ledger: PartitionLedger, offset: int, size: int) -> None:
        with self.lock:
            ledger.pending.append(offset)
            ledger.next_offset = offset + 1
            ledger.buffered += 1
            ledger.bytes += size
            self.total_buffered += 1
            self.total_bytes += size
            self.peak_partition_buffered = max(self.peak_partition_buffered, ledger.buffered)

    def track_many(self, offsets: dict[PartitionLedger, list[int]]) -> None:
        """`track` of records without a size (the precise intake), a batch per lock."""
        with self.lock:
            for ledger, read in offsets.items():
                if not read:
                    continue
                ledger.pending.extend(read)
                ledger.next_offset = read[-1] + 1
                ledger.buffered += len(read)
                self.total_buffered += len(read)
                self.peak_partition_buffered = max(self.peak_partition_buffered, ledger.buffered)

    def advance_many(self, read: dict[PartitionLedger, tuple[int, list[int]]]) -> None:
        """A batch read and handled: per partition, (the next offset to read, the
        offsets of the batch that are not durable yet). Every other record of the batch
        is durable already (its slot write synced), so it needs no tracking of its own:
        the cheap path for the precise intake, whose batches are nearly all durable at
        once. A record pending from before still holds the commit back."""
        with self.lock:
            for ledger, (next_offset, pending) in read.items():
                if ledger.revoked:
                    continue
                if pending:
                    ledger.pending.extend(pending)
                    ledger.buffered += len(pending)
                    self.total_buffered += len(pending)
                ledger.next_offset = next_offset

    def settle_many(self, done: list[tuple[PartitionLedger, int]]) -> None:
        """`settle` of records without a size, a batch per lock."""
        if not done:
            return
        with self.lock:
            for ledger, offset in done:
                if ledger.revoked:
                    continue
                ledger.settled.add(offset)
                ledger.buffered -= 1
                self.total_buffered -= 1

    def settle(self, ledger: PartitionLedger, offset: int, size: int) -> None:
        with self.lock:
            if ledger.revoked:
                return
            ledger.settled.add(offset)
            ledger.buffered -= 1
            ledger.bytes -= size
            self.total_buffered -= 1
            self.total_bytes -= size

    def rewind(self, firsts: dict[int, int]) -> None:
        """Forget each partition's records from `firsts[partition]` on, to be read again.

        For a batch whose handling failed before it was settled: its records are
        neither durable nor buffered, and reading on past them would hold every later
        commit back (and leave those records undelivered) until a restart. A dead
        letter of a forgotten record that becomes durable later still settles its
        offset; the record is then read and dead-lettered again: a duplicate dead
        letter, never a loss."""
        with self.lock:
            for partition, first in firsts.items():
                ledger = self.partitions.get(partition)
                if ledger is None:
                    continue
                dropped = [o for o in ledger.pending if o >= first and o not in ledger.settled]
                ledger.pending = deque(o for o in ledger.pending if o < first)
                ledger.settled = {o for o in ledger.settled if o < first}
                ledger.next_offset = first
                ledger.buffered -= len(dropped)
                self.total_buffered -= len(dropped)

    def to_commit(self) -> list[tuple[int, int]]:
        """(partition, offset) pairs that moved since the last commit."""
        out: list[tuple[int, int]] = []
        with self.lock:
            for partition, ledger in self.partitions.items():
                offset = ledger.committable()
                if offset is not None and offset != ledger.last_committed:
                    out.append((partition, offset))
        return out

    def last_committed(self, partition: int) -> int | None:
        """The last offset the broker confirmed for `partition`: all before it is done."""
        with self.lock:
            ledger = self.partitions.get(partition)
            return None if ledger is None else ledger.last_committed

    def committed(self, pairs: list[tuple[int, int]]) -> None:
        with self.lock:
            for partition, offset in pairs:
                ledger = self.partitions.get(partition)
                if ledger is not None:
                    ledger.last_committed = offset
