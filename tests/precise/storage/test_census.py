"""The census of a precise data directory, on files written by the real slot store (and,
for reschedules, by the real wheel)."""

from __future__ import annotations

from pathlib import Path

from delayservice.precise.placement import Placement
from delayservice.precise.storage import due_buckets
from delayservice.precise.storage.cancel_log import CancelLog, pending_cancels
from delayservice.precise.storage.census import count_files, take_census
from delayservice.precise.storage.data_dir import cancel_log_path, reschedule_log_path
from delayservice.precise.storage.reschedule_log import Move, RescheduleLog
from delayservice.precise.storage.slot_file import StoredRecord, encode, encode_settled
from delayservice.precise.storage.slot_store import SlotStore
from delayservice.precise.wheel.wheel import Reschedule, Wheel
from tests.precise.wheel.test_wheel import Clock, Outcomes

NOW_MS = 1_800_000_000_000
MIN, HOUR, DAY = 60_000, 3_600_000, 86_400_000


def _record(
    offset: int, due_ms: int, *, replica: bool = False, message_id: str = "", copy: bool = False
) -> bytes:
    """A stored message; `copy`: a reschedule's copy of `message_id`, at its marker's offset."""
    message_id = message_id or f"id-{offset}"
    return encode(
        StoredRecord(offset, due_ms, replica, message_id, "t", None, 1, b"k", b"v" * 50, [], copy)
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


def _moves(tmp_path: Path, **entries: Move) -> None:
    log = RescheduleLog(reschedule_log_path(tmp_path, "topic"))
    for message_id, move in entries.items():
        assert log.move(message_id, move)
    log.sync()
    log.close()


def test_a_moved_message_counts_once_by_the_copy_the_wheel_would_send(tmp_path: Path):
    """Moved by the real wheel twice: the original (40 days out, in a span), the first
    copy (3 hours) and the live one (2 minutes) are all on disk."""
    store = SlotStore(tmp_path / "topic")
    cancels = CancelLog(cancel_log_path(tmp_path, "topic"))
    reschedules = RescheduleLog(reschedule_log_path(tmp_path, "topic"))
    clock = Clock()
    clock.now = NOW_MS / 1000
    wheel = Wheel(
        store, cancels, reschedules, Placement(1, 0, 1), Outcomes(), lookahead_s=5.0, clock=clock
    )
    for offset, due_ms in ((1, NOW_MS + 40 * DAY), (2, NOW_MS + 3 * HOUR), (3, NOW_MS + 2 * DAY)):
        wheel.append(0, due_ms, _record(offset, due_ms))
    store.sync()
    for version, due_ms in ((10, NOW_MS + 3 * HOUR), (11, NOW_MS + 2 * MIN)):
        request = Reschedule("id-1", 0, version, due_ms, False, due_ms)
        assert [outcome for outcome, _ in wheel.move_many([request])] == ["moved"]
    store.close()
    cancels.close()
    reschedules.close()

    census = take_census(tmp_path / "topic", NOW_MS)

    assert census.owner == {**due_buckets.empty(), "1h": 1, "1d": 1, "30d": 1}
    assert census.earliest_due_ms == NOW_MS + 2 * MIN


def test_a_copy_no_entry_names_is_not_counted(tmp_path: Path):
    """A copy written by a move that never got its entry (a crash between the two) is
    never sent: the message counts at its first due time."""
    store = SlotStore(tmp_path / "topic")
    _write(store, 0, NOW_MS + HOUR // 2, _record(1, NOW_MS + HOUR // 2))
    _write(store, 0, NOW_MS + 2 * DAY, _record(20, NOW_MS + 2 * DAY, message_id="id-1", copy=True))
    store.sync()
    store.close()

    census = take_census(tmp_path / "topic", NOW_MS)

    assert census.owner == {**due_buckets.empty(), "1h": 1}


def test_a_moved_message_sent_at_its_new_time_is_not_counted(tmp_path: Path):
    """Its live copy is settled; the original it replaced is never sent."""
    store = SlotStore(tmp_path / "topic")
    _write(store, 0, NOW_MS + 3 * HOUR, _record(2, NOW_MS + 3 * HOUR))
    _write(store, 0, NOW_MS + HOUR // 2, _record(3, NOW_MS + HOUR // 2))
    moved_to = NOW_MS - 10 * MIN
    _write(store, 0, moved_to, _record(21, moved_to, message_id="id-2", copy=True))
    _write(store, 0, moved_to, encode_settled(21))
    store.sync()
    store.close()
    _moves(tmp_path, **{"id-2": Move(moved_to, 21, NOW_MS + 3 * HOUR, 0)})

    census = take_census(tmp_path / "topic", NOW_MS)

    assert census.owner == {**due_buckets.empty(), "1h": 1}
    assert census.earliest_due_ms == NOW_MS + HOUR // 2


def test_a_moved_replica_copy_counts_once_among_the_replica_copies(tmp_path: Path):
    store = SlotStore(tmp_path / "topic")
    store.append(
        0, (NOW_MS + 40 * DAY) // 1000, _record(1, NOW_MS + 40 * DAY, replica=True), 86_400
    )
    moved_to = NOW_MS + 2 * MIN
    _write(store, 0, moved_to, _record(9, moved_to, replica=True, message_id="id-1", copy=True))
    store.sync()
    store.close()
    _moves(tmp_path, **{"id-1": Move(moved_to, 9, NOW_MS + 40 * DAY, 0)})

    census = take_census(tmp_path / "topic", NOW_MS)

    assert census.replica == {**due_buckets.empty(), "1h": 1}
    assert census.owned == 0
    assert census.earliest_due_ms is None  # of owner copies only


def test_a_cancel_of_a_moved_message_leaves_none_of_its_copies(tmp_path: Path):
    store = SlotStore(tmp_path / "topic")
    _write(store, 0, NOW_MS + HOUR // 2, _record(1, NOW_MS + HOUR // 2))
    moved_to = NOW_MS + 2 * MIN
    _write(store, 0, moved_to, _record(5, moved_to, message_id="id-1", copy=True))
    store.sync()
    store.close()
    _moves(tmp_path, **{"id-1": Move(moved_to, 5, NOW_MS + HOUR, 0)})

    census = take_census(tmp_path / "topic", NOW_MS, {"id-1"})

    assert census.owned == 0
