"""A fault of the disk stops the intake (and through `on_fatal` the daemon); a fault of
one record dead-letters that record. Faults are injected as the OSErrors the kernel
gives (ENOSPC, EIO) into a real slot directory and cancel log."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from delayservice.precise.intake import record_intake
from delayservice.precise.storage import id_log, slot_store
from delayservice.precise.storage.cancel_log import CancelLog
from delayservice.precise.storage.slot_file import SlotFormatError
from delayservice.precise.storage.slot_store import SlotStore
from delayservice.precise.storage.storage_fault import StorageError
from tests.precise.intake_rig import NOW_MS, Rig, record, running, wait


def _failing(code: int, after: int = 0) -> Callable[..., Any]:
    """An os-level call that works `after` times, then fails with `code`."""
    calls = {"n": 0}

    def fail(*_args: Any, **_kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] > after:
            raise OSError(code, os.strerror(code))
        return None

    return fail


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with running(tmp_path) as made:
        yield made


def _stopped_on_a_fault(rig: Rig, words: str) -> None:
    assert rig.intake.join(10), "the intake went on after a storage fault"
    assert rig.fatal, "on_fatal was not called"
    assert words in rig.fatal[0]
    assert rig.dead.submitted == [], "a record was dead-lettered for a fault of the disk"
    assert rig.consumer.closed


def test_a_full_disk_while_appending_stops_the_intake_and_commits_nothing_of_the_batch(
    rig, monkeypatch
):
    rig.run_batch([record(o) for o in range(3)])
    assert rig.consumer.committed_offsets == {0: 3}
    real_write = slot_store._write_all
    writes = {"n": 0}

    def full_disk(fd: int, data: bytes) -> None:
        writes["n"] += 1
        if writes["n"] > 0:  # a batch writes each file once: its one write fails
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(fd, data)

    monkeypatch.setattr(slot_store, "_write_all", full_disk)
    rig.feed([record(o) for o in range(3, 8)])
    _stopped_on_a_fault(rig, "No space left on device")
    assert rig.consumer.committed_offsets == {0: 3}, "offsets past the fault were committed"


def test_a_failed_fsync_stops_the_intake_before_the_commit(rig, monkeypatch):
    rig.run_batch([record(0)])
    monkeypatch.setattr(slot_store.os, "fsync", _failing(errno.EIO))
    rig.feed([record(1), record(2)])
    _stopped_on_a_fault(rig, "Input/output error")
    monkeypatch.undo()
    assert rig.consumer.committed_offsets == {0: 1}


def test_a_full_disk_under_the_cancel_log_stops_the_intake(rig, monkeypatch):
    rig.run_batch([record(0)])
    monkeypatch.setattr(id_log, "_write_all", _failing(errno.ENOSPC))
    rig.feed([record(1, cancel="id-0-0"), record(2)])
    _stopped_on_a_fault(rig, "No space left on device")
    assert rig.consumer.committed_offsets == {0: 1}
    assert "id-0-0" not in rig.cancels


def test_a_failed_fsync_of_the_cancel_log_stops_the_intake(rig, monkeypatch):
    rig.run_batch([record(0)])
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("cancels.log"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(id_log.os, "fsync", fsync)
    rig.feed([record(1, cancel="id-0-0")])
    _stopped_on_a_fault(rig, "cannot fsync")
    assert rig.consumer.committed_offsets == {0: 1}


def test_a_data_directory_removed_under_the_intake_stops_it(rig):
    rig.run_batch([record(0)])
    shutil.rmtree(rig.root)
    rig.feed([record(1)])
    _stopped_on_a_fault(rig, "storage fault in precise mode")
    assert rig.consumer.committed_offsets == {0: 1}


def test_a_record_that_cannot_be_framed_is_still_dead_lettered(rig, monkeypatch):
    def unframeable(*fields: Any) -> bytes:
        raise SlotFormatError(f"record {fields[3]!r} cannot be framed")

    monkeypatch.setattr(record_intake, "encode_fields", unframeable)
    rig.feed([record(0), record(1)])
    assert wait(lambda: len(rig.dead.submitted) == 2)
    assert rig.intake.is_alive()
    assert rig.fatal == []


def test_the_store_and_the_cancel_log_report_faults_on_any_thread(tmp_path, monkeypatch):
    """The loader and the forwarder handle errors their own way; `on_fault` is how a
    fault they meet still stops the daemon."""
    faults: list[StorageError] = []
    store = SlotStore(tmp_path / "slots", on_fault=faults.append)
    cancels = CancelLog(tmp_path / "cancels.log", on_fault=faults.append)
    store.append(0, 5, b"frame")
    store.sync()
    monkeypatch.setattr(Path, "unlink", _failing(errno.EIO))
    with pytest.raises(StorageError, match="cannot delete slot"):
        store.delete(0, 5)
    monkeypatch.setattr(slot_store, "_write_all", _failing(errno.ENOSPC))
    with pytest.raises(StorageError, match="No space left"):
        store.append(0, 6, b"frame")
    cancels.add("x", NOW_MS)
    monkeypatch.setattr(id_log, "_write_all", _failing(errno.ENOSPC))
    with pytest.raises(StorageError):
        cancels.matched("x")
    with pytest.raises(StorageError):
        cancels.expire(NOW_MS + 1)
    assert len(faults) == 4
    assert all(isinstance(f, StorageError) for f in faults)
