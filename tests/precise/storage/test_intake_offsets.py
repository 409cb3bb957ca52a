"""How far the intake got, kept beside the slot files: what a restart reads back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from delayservice.precise.storage.intake_offsets import (
    PARTITION_BYTES,
    RECORD_BYTES,
    IntakeOffsets,
    IntakeOffsetsError,
)
from delayservice.precise.storage.storage_fault import StorageError


def _reopen(offsets: IntakeOffsets, path: Path) -> IntakeOffsets:
    """The process dies (nothing is synced: the page cache keeps the writes)."""
    offsets.close()
    return IntakeOffsets(path)


def test_commits_and_batches_begun_are_read_back_after_a_restart(tmp_path):
    path = tmp_path / "t.offsets"
    offsets = IntakeOffsets(path)
    offsets.wrote([(0, 10), (2, 5)])
    offsets.committed([(0, 10), (2, 3)])
    offsets.wrote([(0, 25)])  # a batch begun, never committed
    again = _reopen(offsets, path)
    assert again.resume(0) == 10
    assert again.resume(2) == 3
    assert again.resume(1) is None  # never written
    assert again.resume(3) is None
    assert again.in_flight() == {0: 25, 2: 5}


def test_a_batch_begun_before_any_commit_is_in_flight_with_nothing_to_resume(tmp_path):
    path = tmp_path / "t.offsets"
    offsets = IntakeOffsets(path)
    offsets.wrote([(1, 7)])
    again = _reopen(offsets, path)
    assert again.resume(1) is None
    assert again.in_flight() == {1: 7}


def test_a_commit_of_the_whole_batch_leaves_nothing_in_flight(tmp_path):
    path = tmp_path / "t.offsets"
    offsets = IntakeOffsets(path)
    for end in range(1, 50):
        offsets.wrote([(0, end)])
        offsets.committed([(0, end)])
    again = _reopen(offsets, path)
    assert again.resume(0) == 49
    assert again.in_flight() == {}


@pytest.mark.parametrize(("torn", "read_back"), [("newer", 100), ("older", 200)])
def test_a_torn_record_leaves_the_other_one(tmp_path, torn, read_back):
    """A machine crash may tear the record being written: the other one still holds
    the previous value (an older one only makes the intake read more again)."""
    path = tmp_path / "t.offsets"
    offsets = IntakeOffsets(path)
    offsets.committed([(0, 100)])  # sequence 1: the second record
    offsets.committed([(0, 200)])  # sequence 2: the first record
    offsets.close()
    position = (0 if torn == "newer" else RECORD_BYTES) + 9  # inside its offset
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, b"\xff", position)
    finally:
        os.close(fd)
    assert IntakeOffsets(path).resume(0) == read_back


def test_any_bytes_read_as_offsets_or_as_nothing(tmp_path):
    path = tmp_path / "t.offsets"
    path.write_bytes(os.urandom(PARTITION_BYTES * 3 + 7))
    offsets = IntakeOffsets(path)
    assert [offsets.resume(p) for p in range(4)] == [None] * 4
    offsets.committed([(3, 9)])
    assert _reopen(offsets, path).resume(3) == 9


def test_a_failed_write_is_a_storage_fault_told_to_the_owner(tmp_path, monkeypatch):
    faults: list[StorageError] = []
    offsets = IntakeOffsets(tmp_path / "t.offsets", on_fault=faults.append)

    def full(*_args: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(IntakeOffsetsError, match="No space left"):
        offsets.committed([(0, 1)])
    assert len(faults) == 1
    assert offsets.resume(0) is None  # what could not be written is not claimed


def test_an_unusable_path_is_refused(tmp_path):
    with pytest.raises(IntakeOffsetsError, match="cannot open"):
        IntakeOffsets(tmp_path / "missing" / "t.offsets")
