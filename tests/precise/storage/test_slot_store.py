"""The slot directory: appends survive eviction and reopening, torn tails are cut,
sync touches exactly what changed, and disk errors surface as SlotStoreError."""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from delayservice.errors import DelayServiceError
from delayservice.precise.storage import slot_store
from delayservice.precise.storage.slot_file import StoredRecord, encode
from delayservice.precise.storage.slot_store import SlotStore, SlotStoreError


def record(n: int, second: int = 0) -> StoredRecord:
    return StoredRecord(
        offset=n,
        due_ms=second * 1000 + n % 1000,
        replica=False,
        message_id=f"id-{n}",
        target="orders",
        target_partition=None,
        delay_ms=1000,
        key=b"k",
        value=b"v%d" % n,
        headers=[("h", None)],
    )


def frame(n: int, second: int = 0) -> bytes:
    return encode(record(n, second))


@pytest.fixture
def store(tmp_path: Path) -> SlotStore:
    return SlotStore(tmp_path / "wheel")


def test_append_sync_read_delete(store: SlotStore, tmp_path: Path) -> None:
    store.append(3, 100, frame(1) + frame(2))
    store.append(3, 100, frame(3))
    store.sync()
    assert store.read(3, 100) == [record(1), record(2), record(3)]
    assert (tmp_path / "wheel" / "p3" / "100.slot").is_file()
    store.delete(3, 100)
    assert store.read(3, 100) == []
    assert not (tmp_path / "wheel" / "p3" / "100.slot").exists()
    assert store.slots() == []


def test_append_to_writes_only_to_the_file_it_names(store: SlotStore, tmp_path: Path) -> None:
    """Settled marks written after the wheel let go of its lock: a slot deleted meanwhile
    stays deleted, and a new file of the same name gets nothing meant for the old one."""
    store.append(0, 100, frame(1))
    first = store.file_id(0, 100)
    assert first is not None
    assert store.append_to(0, 100, first, frame(2))
    store.delete(0, 100)
    assert not store.append_to(0, 100, first, frame(3))
    assert store.file_id(0, 100) is None
    assert not (tmp_path / "wheel" / "p0" / "100.slot").exists()
    store.append(0, 100, frame(4))
    assert store.file_id(0, 100) != first
    assert not store.append_to(0, 100, first, frame(5))
    assert store.read(0, 100) == [record(4)]
    assert SlotStore(tmp_path / "wheel").file_id(0, 100) is not None  # found on disk too


def test_missing_slot_reads_empty_and_deletes_quietly(store: SlotStore) -> None:
    assert store.read(0, 5) == []
    store.delete(0, 5)
    assert store.slots() == []


def test_slots_are_sorted_by_second_then_partition_and_kept_up_to_date(
    store: SlotStore, tmp_path: Path
) -> None:
    store.append(1, 20, frame(1))
    store.append(0, 20, frame(2))
    store.append(0, 10, frame(3))
    store.append(2, 5, frame(4))
    assert store.slots() == [(5, 2), (10, 0), (20, 0), (20, 1)]
    store.delete(0, 20)
    assert store.slots() == [(5, 2), (10, 0), (20, 1)]
    store.append(0, 20, frame(5))
    assert store.slots() == [(5, 2), (10, 0), (20, 0), (20, 1)]
    (tmp_path / "wheel" / "p0" / "7.slot").write_bytes(frame(6))
    assert (7, 0) not in store.slots()  # memory, not a rescan


def _open_fds_under(root: Path) -> int:
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith(str(root)):
                count += 1
        except OSError:
            continue
    return count


def test_lru_with_two_handles_keeps_every_append(tmp_path: Path) -> None:
    root = tmp_path / "wheel"
    store = SlotStore(root, open_files=2)
    for round_ in range(3):
        for second in range(10):
            store.append(second % 2, second, frame(round_ * 100 + second, second))
            if os.path.isdir("/proc/self/fd"):
                assert _open_fds_under(root) <= 2
    store.sync()
    for second in range(10):
        expected = [record(round_ * 100 + second, second) for round_ in range(3)]
        assert store.read(second % 2, second) == expected
    store.close()
    if os.path.isdir("/proc/self/fd"):
        assert _open_fds_under(root) == 0


def test_reopening_sees_the_same_slots_and_data(tmp_path: Path) -> None:
    first = SlotStore(tmp_path)
    first.append(0, 50, frame(1))
    first.append(4, 40, frame(2) + frame(3))
    first.sync()
    first.close()
    second = SlotStore(tmp_path)
    assert second.slots() == [(40, 4), (50, 0)]
    assert second.read(4, 40) == [record(2), record(3)]
    assert second.disk_bytes() == len(frame(1)) + len(frame(2)) + len(frame(3))
    second.append(0, 50, frame(4))
    assert second.read(0, 50) == [record(1), record(4)]


def test_torn_tail_is_dropped_on_read_and_cut_before_the_next_append(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = SlotStore(tmp_path)
    first.append(0, 9, frame(1) + frame(2))
    first.sync()
    first.close()
    path = tmp_path / "p0" / "9.slot"
    torn = frame(3)[:17]
    with path.open("ab") as file:
        file.write(torn)

    second = SlotStore(tmp_path)
    with caplog.at_level(logging.WARNING, logger=slot_store.__name__):
        assert second.read(0, 9) == [record(1), record(2)]
    assert any(f"{len(torn)} bytes dropped" in r.getMessage() for r in caplog.records)
    assert second.disk_bytes() == len(frame(1)) + len(frame(2)) + len(torn)

    second.append(0, 9, frame(4))
    assert second.read(0, 9) == [record(1), record(2), record(4)]
    assert path.stat().st_size == len(frame(1)) + len(frame(2)) + len(frame(4))
    assert second.disk_bytes() == path.stat().st_size


def test_partial_write_is_taken_back(store: SlotStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.append(0, 1, frame(1))
    real_write = os.write

    def half_then_full(fd: int, data: bytes | memoryview) -> int:
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(SlotStoreError) as caught:
        store.append(0, 1, frame(2))
    assert caught.value.retriable
    assert "1.slot" in str(caught.value)
    monkeypatch.setattr(os, "write", real_write)
    store.append(0, 1, frame(3))
    assert store.read(0, 1) == [record(1), record(3)]
    assert store.disk_bytes() == len(frame(1)) + len(frame(3))


def _fsync_recorder(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name descriptors")
def test_sync_fsyncs_each_touched_file_and_directory_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SlotStore(tmp_path, open_files=1)
    store.append(0, 1, frame(1))
    store.sync()
    synced = _fsync_recorder(monkeypatch)
    store.append(0, 1, frame(2))  # existing file: no directory change in p0
    store.append(0, 1, frame(3))
    store.append(5, 2, frame(4))  # new directory p5 and new file: evicts p0/1.slot
    store.append(5, 3, frame(5))
    store.sync()
    assert sorted(synced) == sorted(
        [
            str(tmp_path / "p0" / "1.slot"),
            str(tmp_path / "p5" / "2.slot"),
            str(tmp_path / "p5" / "3.slot"),
            str(tmp_path / "p5"),
            str(tmp_path),
        ]
    )
    synced.clear()
    store.sync()
    assert synced == []
    store.delete(5, 2)
    store.sync()
    assert synced == [str(tmp_path / "p5")]  # the removal is made durable too


def test_many_touched_files_use_one_syncfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def fake_syncfs(fd: int) -> int:
        calls.append(fd)
        return 0

    monkeypatch.setattr(slot_store, "_syncfs", lambda: fake_syncfs)
    synced = _fsync_recorder(monkeypatch) if os.path.isdir("/proc/self/fd") else []
    store = SlotStore(tmp_path, open_files=4)
    for second in range(slot_store.SYNCFS_ABOVE + 1):
        store.append(0, second, frame(second))
    store.sync()
    assert len(calls) == 1
    assert synced == []


def test_many_touched_files_fall_back_to_fsync_without_syncfs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slot_store, "_syncfs", lambda: None)
    fsyncs: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        fsyncs.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store = SlotStore(tmp_path, open_files=4)
    count = slot_store.SYNCFS_ABOVE + 1
    for second in range(count):
        store.append(0, second, frame(second))
    store.sync()
    assert len(fsyncs) == count + 2  # every file, p0 and the root
    assert SlotStore(tmp_path).read(0, count - 1) == [record(count - 1)]


def test_real_sync_of_many_files_keeps_the_data(tmp_path: Path) -> None:
    store = SlotStore(tmp_path, open_files=4)
    for second in range(40):
        store.append(second % 3, second, frame(second))
    store.sync()
    store.close()
    again = SlotStore(tmp_path)
    assert len(again.slots()) == 40
    assert all(again.read(s % 3, s) == [record(s)] for s in range(40))


def test_origin_round_trip_and_durability(tmp_path: Path) -> None:
    store = SlotStore(tmp_path)
    assert store.origin(7) is None
    store.set_origin(7, 12345)
    assert store.origin(7) == 12345
    store.set_origin(7, 12346)
    assert (tmp_path / "p7" / "origin").read_text().strip() == "12346"
    store.close()
    again = SlotStore(tmp_path)
    assert again.origin(7) == 12346
    assert again.origin(8) is None
    assert again.slots() == []


def test_unreadable_origin_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "p1").mkdir()
    (tmp_path / "p1" / "origin").write_text("not a number")
    with pytest.raises(SlotStoreError, match="origin"):
        SlotStore(tmp_path).origin(1)


def test_unknown_files_are_ignored_with_one_warning_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "p0").mkdir()
    (tmp_path / "p0" / "3.slot").write_bytes(frame(1))
    (tmp_path / "p0" / "origin").write_text("5\n")
    unknown = [
        tmp_path / "README",
        tmp_path / "p0" / "notes.txt",
        tmp_path / "p0" / "03.slot",
        tmp_path / "p0" / "3.slot.bak",
        tmp_path / "x1",
        tmp_path / "p01",
    ]
    for path in unknown[:4]:
        path.write_bytes(frame(2))
    for path in unknown[4:]:
        path.mkdir()
        (path / "4.slot").write_bytes(frame(3))
    with caplog.at_level(logging.WARNING, logger=slot_store.__name__):
        store = SlotStore(tmp_path)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == len(unknown)
    for path in unknown:
        assert sum(str(path) in message.split() for message in warned) == 1, path
    assert store.slots() == [(3, 0)]
    assert store.origin(0) == 5
    assert store.disk_bytes() == len(frame(1))


def _permissions_enforced(directory: Path) -> bool:
    """False for root (or anyone with CAP_DAC_OVERRIDE), who may write anywhere."""
    probe = directory / "probe"
    probe.mkdir(mode=0o500)
    try:
        (probe / "file").touch()
    except PermissionError:
        return True
    finally:
        probe.chmod(0o700)
    return False


def test_read_only_directory_raises_slot_store_error(tmp_path: Path) -> None:
    if not _permissions_enforced(tmp_path):
        pytest.skip("permissions are not enforced for this user (root)")
    root = tmp_path / "wheel"
    store = SlotStore(root)
    store.append(0, 1, frame(1))
    (root / "p0").chmod(0o500)
    try:
        with pytest.raises(SlotStoreError) as caught:
            store.append(0, 2, frame(2))
        assert str(root / "p0" / "2.slot") in str(caught.value)
        assert caught.value.retriable
    finally:
        (root / "p0").chmod(0o700)


def test_os_error_becomes_retriable_slot_store_error(tmp_path: Path) -> None:
    (tmp_path / "p0" / "2.slot").mkdir(parents=True)  # a directory where a file must go
    store = SlotStore(tmp_path)
    with pytest.raises(SlotStoreError) as caught:
        store.append(0, 2, frame(1))
    assert isinstance(caught.value, DelayServiceError)
    assert caught.value.retriable
    assert str(tmp_path / "p0" / "2.slot") in str(caught.value)


def test_disk_bytes_tracks_appends_and_deletes(store: SlotStore) -> None:
    assert store.disk_bytes() == 0
    store.append(0, 1, frame(1))
    store.append(0, 2, frame(2) + frame(3))
    assert store.disk_bytes() == len(frame(1)) + len(frame(2)) + len(frame(3))
    store.delete(0, 2)
    assert store.disk_bytes() == len(frame(1))
    store.delete(0, 1)
    assert store.disk_bytes() == 0


def test_large_records_round_trip(store: SlotStore) -> None:
    big = record(1)._replace(value=os.urandom(6 * 1024 * 1024))
    store.append(0, 1, encode(big))
    store.sync()
    assert store.read(0, 1) == [big]


def test_closed_store_refuses_appends(store: SlotStore) -> None:
    store.close()
    with pytest.raises(SlotStoreError, match="closed"):
        store.append(0, 1, frame(1))


def _run(*targets: Callable[[], None]) -> None:
    errors: list[BaseException] = []

    def guard(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:
                errors.append(exc)

        return run

    threads = [threading.Thread(target=guard(target)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []


def test_reads_during_appends_see_whole_records_only(
    store: SlotStore, caplog: pytest.LogCaptureFixture
) -> None:
    count = 2000
    frames = [frame(n) for n in range(count)]
    done = threading.Event()
    seen: list[int] = []

    def intake() -> None:
        for n in range(count):
            store.append(0, 1, frames[n])
            if n % 100 == 0:
                store.sync()
        done.set()

    def forwarder() -> None:
        while not done.is_set():
            found = store.read(0, 1)
            assert found == [record(n) for n in range(len(found))]
            seen.append(len(found))

    with caplog.at_level(logging.WARNING, logger=slot_store.__name__):
        _run(intake, forwarder)
    assert caplog.records == []  # never a torn tail from a half-finished append
    assert seen == sorted(seen)
    assert len(store.read(0, 1)) == count
