"""A slot's index hands records out in leaving order, reading the file in few, mostly
wanted windows: records of one second arrive over the whole span of delays, so their
leaving order is not their order in the file."""

from __future__ import annotations

import random

from delayservice.precise.storage.slot_file import StoredRecord, encode
from delayservice.precise.storage.slot_index import SlotIndex

SECOND = 1_700_000_000


def _file(count: int, rng: random.Random, value_bytes: int = 200) -> tuple[bytes, list[int]]:
    """Frames appended in offset order with due milliseconds in random order, as a
    steady stream with spread delays writes them; and the offsets in leaving order."""
    dues = [SECOND * 1000 + rng.randrange(1000) for _ in range(count)]
    value = bytes(value_bytes)
    frames = [
        encode(StoredRecord(offset, due, False, f"id-{offset}", "t", None, 0, b"k", value, []))
        for offset, due in enumerate(dues)
    ]
    leaving = [offset for _, offset in sorted((due, offset) for offset, due in enumerate(dues))]
    return b"".join(frames), leaving


class CountingReader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.reads: list[int] = []

    def __call__(self, position: int, length: int) -> bytes:
        self.reads.append(length)
        return self.data[position : position + length]


def test_records_leave_in_due_order_from_a_few_reads() -> None:
    data, leaving = _file(5_000, random.Random(1))
    reader = CountingReader(data)
    index = SlotIndex(reader, len(data), SECOND, 0)
    reader.reads.clear()
    taken = []
    while index:
        taken += [record.offset for record in index.take(1_000)]
    assert taken == leaving
    # One read per record before (5,000); each take of a fifth, scattered over the
    # file, now reads it in 64 KiB windows: 20 a take.
    assert len(reader.reads) <= len(leaving) // 25
    assert sum(reader.reads) <= 5 * len(data)


def test_a_few_records_wanted_from_a_big_slot_do_not_read_all_of_it() -> None:
    data, leaving = _file(20_000, random.Random(2))
    reader = CountingReader(data)
    index = SlotIndex(reader, len(data), SECOND, 0)
    reader.reads.clear()
    taken = [record.offset for record in index.take(10)]
    assert taken == leaving[:10]
    assert sum(reader.reads) < len(data) // 10
