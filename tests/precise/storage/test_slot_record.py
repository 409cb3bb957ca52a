"""A slot file keeps a record's `delay-partitioner` after the user's headers, and a
record loaded from it has it back in its envelope, its user headers as they were."""

from __future__ import annotations

import pytest

from delayservice.envelope import H_PARTITIONER
from delayservice.precise.storage.slot_file import decode, encode_fields
from delayservice.precise.storage.slot_record import SlotRecord, stored_headers


@pytest.mark.parametrize("partitioner", [None, "consistent_random", "fnv1a", "murmur2"])
def test_a_stored_records_partitioner_comes_back_in_its_envelope(partitioner):
    user = [("trace", b"t-1"), ("empty", None)]
    frame = encode_fields(
        7, 1_700_000_000_000, False, "id-7", "orders", None, 3_000, b"k", b"v",
        stored_headers(user, partitioner),
    )  # fmt: skip
    (item,), _ = decode(frame)
    record = SlotRecord.stored(item, 2, slot=None)
    assert record.envelope is not None
    assert record.envelope.partitioner == partitioner
    assert record.user == user
    named = [value for name, value in record.headers() if name == H_PARTITIONER]
    assert named == ([partitioner.encode()] if partitioner else [])


def test_a_stored_header_that_names_no_partitioner_is_left_out():
    frame = encode_fields(
        1, 1, False, "id-1", "orders", None, 1, None, None,
        [("trace", b"t"), (H_PARTITIONER, b"crc64")],
    )  # fmt: skip
    (item,), _ = decode(frame)
    record = SlotRecord.stored(item, 0, slot=None)
    assert record.envelope is not None
    assert record.envelope.partitioner is None
    assert record.user == [("trace", b"t")]
