"""The search for a message's stored copies: every copy not settled, wherever the id
falls against the chunks the files are read in."""

from __future__ import annotations

from pathlib import Path

import pytest

from delayservice.precise.storage import copy_finder
from delayservice.precise.storage.copy_finder import find_copies
from delayservice.precise.storage.slot_file import StoredRecord, encode, encode_settled
from delayservice.precise.storage.slot_store import SlotStore


def stored(offset: int, message_id: str, value: bytes = b"v") -> StoredRecord:
    return StoredRecord(offset, 1000, False, message_id, "t", None, 0, b"k", value, [])


@pytest.mark.parametrize("chunk", [7, 16, 31, 64, 4096])
def test_every_copy_is_found_whatever_the_chunk_size(tmp_path: Path, monkeypatch, chunk):
    monkeypatch.setattr(copy_finder, "CHUNK", chunk)
    store = SlotStore(tmp_path)
    frames = b"".join(encode(stored(o, f"other-{o}", b"x" * o)) for o in range(40))
    store.append(0, 100, frames + encode(stored(40, "wanted")) + frames)
    store.append(0, 200, encode(stored(41, "wanted")), width=3600)
    store.append(1, 100, encode(stored(42, "wanted")))  # another partition
    found = find_copies(store.files(0), store.read_at, {"wanted", "absent"})
    assert sorted(copy.offset for copy in found["wanted"]) == [40, 41]
    assert "absent" not in found


def test_settled_copies_and_ids_only_inside_values_are_not_copies(tmp_path: Path):
    store = SlotStore(tmp_path)
    store.append(0, 100, encode(stored(1, "m")) + encode(stored(2, "n", b"mentions m")))
    store.append(0, 100, encode_settled(1))
    assert find_copies(store.files(0), store.read_at, {"m"}) == {}


def test_a_file_deleted_under_the_search_reads_as_empty(tmp_path: Path):
    store = SlotStore(tmp_path)
    store.append(0, 100, encode(stored(1, "m")))
    files = store.files(0)
    store.delete(0, 100)
    assert find_copies(files, store.read_at, {"m"}) == {}
