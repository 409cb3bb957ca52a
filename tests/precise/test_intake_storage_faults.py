"""A fault of the disk stops the intake (and through `on_fatal` the daemon); a fault of
one record dead-letters that record. Faults are injected as the OSErrors the kernel
gives (ENOSPC, EIO) into a real slot directory and cancel log."""

from __future__ import annotations

import errno
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka import Message, TopicPartition
from prometheus_client import CollectorRegistry

from delayservice.envelope import H_CANCEL, H_VERSION, Envelope
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.precise import cancel_log, intake, slot_store
from delayservice.precise.cancel_log import CancelLog
from delayservice.precise.intake import Intake
from delayservice.precise.placement import Placement
from delayservice.precise.precise_worker import PreciseLevel
from delayservice.precise.slot_file import SlotFormatError
from delayservice.precise.slot_ledger import PreciseLedger
from delayservice.precise.slot_store import SlotStore
from delayservice.precise.storage_fault import DataDirWatch, StorageError
from delayservice.precise.wheel import Wheel, WheelBuffer
from delayservice.worker.admission import Admission
from delayservice.worker.forwarder import Forwarder
from delayservice.worker.record import HeldRecord
from tests.worker.fakes import message

TOPIC = "precise"
NOW_MS = 1_800_000_000_000
FAR_MS = 3_600_000  # due in an hour: the record stays on disk


def record(offset: int, *, partition: int = 0, cancel: str | None = None) -> Message:
    if cancel is None:
        headers = Envelope("orders", FAR_MS, f"id-{partition}-{offset}").headers()
        return message(partition, offset, NOW_MS, headers=headers, topic=TOPIC)
    headers = [(H_VERSION, b"1"), (H_CANCEL, cancel.encode())]
    return message(partition, offset, NOW_MS, headers=headers, key=None, value=None, topic=TOPIC)


class Consumer:
    """Hands out the queued batches one per consume(), then nothing."""

    def __init__(self, partitions: int = 1) -> None:
        self.partitions = partitions
        self.batches: list[list[Message]] = []
        self.committed_offsets: dict[int, int] = {}
        self.closed = False
        self.lock = threading.Lock()
        self.consumed = threading.Condition(self.lock)
        self.taken = 0

    def make(self, _config: dict[str, Any]) -> Consumer:
        return self

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        class Topic:
            error = None
            partitions = dict.fromkeys(range(self.partitions))

        return type("Meta", (), {"topics": {TOPIC: Topic}})

    def committed(self, partitions: list[TopicPartition], timeout: float = -1) -> Any:
        return [TopicPartition(TOPIC, tp.partition, -1001) for tp in partitions]

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        pass

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        with self.lock:
            if self.batches:
                self.taken += 1
                self.consumed.notify_all()
                return self.batches.pop(0)
        threading.Event().wait(min(timeout, 0.01))
        with self.lock:
            self.consumed.notify_all()
        return []

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> Any:
        with self.lock:
            for tp in offsets:
                self.committed_offsets[tp.partition] = tp.offset
        return [TopicPartition(TOPIC, tp.partition, tp.offset) for tp in offsets]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return partitions

    def get_watermark_offsets(self, *_args: Any, **_kwargs: Any) -> tuple[int, int]:
        return 0, 0

    def close(self) -> None:
        self.closed = True

    def wait_drained(self, timeout: float = 10) -> None:
        with self.lock:
            assert self.consumed.wait_for(lambda: not self.batches, timeout)


class DeadLetters:
    """Stands in for the forwarder: only dead letters reach it from the intake."""

    def __init__(self) -> None:
        self.submitted: list[HeldRecord] = []

    def submit(self, held: HeldRecord) -> None:
        self.submitted.append(held)

    def publish_counts(self) -> None:
        pass


class Rig:
    def __init__(self, root: Path, partitions: int = 1) -> None:
        metrics = ServiceMetrics(CollectorRegistry())
        self.root = root
        self.store = SlotStore(root / "slots")
        self.cancels = CancelLog(root / "cancels.log")
        self.fatal: list[str] = []
        self.store.on_fault = self.cancels.on_fault = lambda f: self.fatal.append(str(f))
        self.consumer = Consumer(partitions)
        self.dead = DeadLetters()
        placement = Placement(1, 0, 1)
        wheel = Wheel(
            self.store,
            self.cancels,
            WheelBuffer(lambda: NOW_MS / 1000),
            placement,
            cast(Any, _Outcomes()),
            lookahead_s=2.0,
            clock=lambda: NOW_MS / 1000,
        )
        level = PreciseLevel(0, 0, TOPIC)
        self.intake = Intake(
            TOPIC,
            self.consumer.make,
            wheel,
            self.store,
            self.cancels,
            PreciseLedger(wheel.settled),
            Admission(level, 0, 86_400_000, frozenset({TOPIC}), metrics, exact=True),
            cast(Forwarder, self.dead),
            placement,
            metrics,
            level_name="exact",
            takeover_ms=0,
            max_delay_ms=86_400_000,
            on_fatal=self.fatal.append,
            check_storage=DataDirWatch(root / "slots", root / "cancels.log").check,
        )

    def feed(self, *batches: list[Message]) -> None:
        with self.consumer.lock:
            self.consumer.batches.extend(batches)

    def run_batch(self, batch: list[Message]) -> None:
        """One batch through the running intake, and the commit after it."""
        self.feed(batch)
        self.consumer.wait_drained()
        assert _wait(lambda: not self.intake.is_alive() or self._committed_past(batch))

    def _committed_past(self, batch: list[Message]) -> bool:
        last = batch[-1]
        return self.consumer.committed_offsets.get(last.partition() or 0, -1) > (last.offset() or 0)

    def stop(self) -> None:
        self.intake.request_stop()
        assert self.intake.join(10)


class _Outcomes:
    def cancelled(self, outcome: str, count: int = 1) -> None:
        pass

    def cleaned(self) -> None:
        pass

    def took_over(self) -> None:
        pass


def _wait(condition: Callable[[], bool], timeout: float = 10) -> bool:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return True
        done.wait(0.01)
    return condition()


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
def rig(tmp_path: Path):
    made = Rig(tmp_path)
    made.intake.start()
    yield made
    made.intake.request_stop()
    made.intake.join(10)


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
    monkeypatch.setattr(cancel_log, "_write_all", _failing(errno.ENOSPC))
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

    monkeypatch.setattr(cancel_log.os, "fsync", fsync)
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
    def unframeable(stored: Any) -> bytes:
        raise SlotFormatError(f"record {stored.message_id!r} cannot be framed")

    monkeypatch.setattr(intake, "encode", unframeable)
    rig.feed([record(0), record(1)])
    assert _wait(lambda: len(rig.dead.submitted) == 2)
    assert rig.intake.is_alive()
    assert rig.fatal == []


def test_the_store_and_the_cancel_log_report_faults_on_any_thread(tmp_path, monkeypatch):
    """The loader and the forwarder handle errors their own way; `on_fault` is how a
    fault they meet still stops the daemon."""
    faults: list[StorageError] = []
    store = SlotStore(tmp_path / "slots")
    cancels = CancelLog(tmp_path / "cancels.log")
    store.on_fault = cancels.on_fault = faults.append
    store.append(0, 5, b"frame")
    store.sync()
    monkeypatch.setattr(Path, "unlink", _failing(errno.EIO))
    with pytest.raises(StorageError, match="cannot delete slot"):
        store.delete(0, 5)
    monkeypatch.setattr(slot_store, "_write_all", _failing(errno.ENOSPC))
    with pytest.raises(StorageError, match="No space left"):
        store.append(0, 6, b"frame")
    cancels.add("x", NOW_MS)
    monkeypatch.setattr(cancel_log, "_write_all", _failing(errno.ENOSPC))
    with pytest.raises(StorageError):
        cancels.matched("x")
    with pytest.raises(StorageError):
        cancels.expire(NOW_MS + 1)
    assert len(faults) == 4
    assert all(isinstance(f, StorageError) for f in faults)
