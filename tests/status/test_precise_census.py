"""The census of a precise data directory, on files written by the real slot store."""

from __future__ import annotations

from pathlib import Path

from delayservice.precise.cancel_log import CancelLog, pending_cancels
from delayservice.precise.slot_file import StoredRecord, encode, encode_settled
from delayservice.precise.slot_store import SlotStore
from delayservice.status import due_buckets
from delayservice.status.precise_census import count_files, take_census

NOW_MS = 1_800_000_000_000
MIN, HOUR, DAY = 60_000, 3_600_000, 86_400_000


def _record(offset: int, due_ms: int, *, replica: bool = False) -> bytes:
    return encode(
        StoredRecord(offset, due_ms, replica, f"id-{offset}", "t", None, 1, b"k", b"v" * 50, [])
    )


def _write(store: SlotStore, partition: int, due_ms: int, frames: bytes) -> None:
    second = due_ms // 1000
    store.append(partition, second, frames)


def test_counts_unsettled_owner_copies_by_due_class_and_replicas_apart(tmp_path: Path):
    store = SlotStore(tmp_path / "topic")
    _write(store, 0, NOW_MS - 5_000, _record(1, NOW_MS - 5_000))  # overdue
    _write(store, 0, NOW_MS + 30_000, _record(2, NOW_MS + 30_000) + _record(3, NOW_MS + 30_000))
    _write(store, 0, NOW_MS + 30_000, encode_settled(2))  # forwarded: not pending
    _write(store, 1, NOW_MS + 10 * MIN, _record(4, NOW_MS + 10 * MIN))
    store.append(1, (NOW_MS + 2 * DAY) // 1000, _record(5, NOW_MS + 2 * DAY), width=86_400)
    store.append(1, (NOW_MS + 90 * DAY) // 1000, _record(6, NOW_MS + 90 * DAY), width=2_764_800)
    _write(store, 2, NOW_MS + 3 * HOUR, _record(7, NOW_MS + 3 * HOUR, replica=True))
    store.sync()
    store.close()

    census = take_census(tmp_path / "topic", NOW_MS)

    assert census.owner == {"overdue": 1, "1m": 1, "1h": 1, "1d": 0, "30d": 1, "later": 1}
    assert census.replica == {**due_buckets.empty(), "1d": 1}
    assert census.earliest_due_ms == NOW_MS - 5_000
    assert census.files == count_files(tmp_path / "topic") == 6


def test_cancelled_ids_in_the_cancel_file_are_not_counted(tmp_path: Path):
    store = SlotStore(tmp_path / "topic")
    _write(
        store,
        0,
        NOW_MS + HOUR // 2,
        _record(1, NOW_MS + HOUR // 2) + _record(2, NOW_MS + HOUR // 2),
    )
    store.sync()
    cancels = CancelLog(tmp_path / "topic.cancels.log")
    cancels.add("id-2", NOW_MS + DAY)
    cancels.add("id-never-sent", NOW_MS + DAY)
    cancels.sync()

    census = take_census(
        tmp_path / "topic", NOW_MS, pending_cancels(tmp_path / "topic.cancels.log")
    )

    assert census.owned == 1
    assert census.owner["1h"] == 1
    cancels.close()
    store.close()


def test_a_torn_tail_or_damaged_frame_ends_the_count_of_its_file(tmp_path: Path):
    store = SlotStore(tmp_path / "topic")
    _write(store, 0, NOW_MS + MIN // 2, _record(1, NOW_MS + MIN // 2))
    store.sync()
    store.close()
    (path,) = (tmp_path / "topic" / "p0").glob("*.slot")
    whole = path.read_bytes()
    path.write_bytes(whole + _record(2, NOW_MS + MIN // 2)[:-3])  # torn by a crash
    assert take_census(tmp_path / "topic", NOW_MS).owned == 1
    damaged = bytearray(_record(3, NOW_MS + MIN // 2))
    damaged[-1] ^= 0xFF
    path.write_bytes(whole + bytes(damaged) + _record(4, NOW_MS + MIN // 2))
    assert take_census(tmp_path / "topic", NOW_MS).owned == 1


def test_a_missing_directory_holds_nothing(tmp_path: Path):
    census = take_census(tmp_path / "absent", NOW_MS)
    assert census.owned == census.replicas == census.files == 0
    assert count_files(tmp_path / "absent") == 0


def test_due_classes_have_inclusive_upper_bounds():
    assert due_buckets.bucket_of(NOW_MS - 1, NOW_MS) == "overdue"
    assert due_buckets.bucket_of(NOW_MS, NOW_MS) == "1m"
    assert due_buckets.bucket_of(NOW_MS + MIN, NOW_MS) == "1m"
    assert due_buckets.bucket_of(NOW_MS + MIN + 1, NOW_MS) == "1h"
    assert due_buckets.bucket_of(NOW_MS + 30 * DAY + 1, NOW_MS) == "later"
