"""The precise worker's storage-fault wiring: a fault met on any thread stops the
daemon once, through `on_fatal`, and the loader's and forwarder's calls into the
store do not raise into threads that would go on."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.precise.precise_worker import PreciseWorker
from delayservice.precise.storage import slot_store
from delayservice.precise.storage.slot_file import StoredRecord
from delayservice.precise.storage.slot_record import SlotRecord
from delayservice.precise.wheel.slot_ledger import SlotTracker
from delayservice.settings_loading import load_settings
from tests.level.fakes import TARGET, FakeProducer, wait_for


class NoProducer:
    """The progress reports' producer; nothing here sends through it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the producer was used: {name}")


@pytest.fixture
def worker(tmp_path: Path):
    settings = load_settings(
        levels="1s", precise=True, precise_topic="timers", data_dir=tmp_path / "data"
    )
    fatal: list[str] = []
    made = PreciseWorker(
        settings,
        ServiceMetrics(CollectorRegistry()),
        NoProducer(),  # type: ignore[arg-type]
        fatal.append,
        make_producer=lambda config: FakeProducer(config=config),
    )
    made.fatal = fatal  # type: ignore[attr-defined]
    # The intake, not started here, caught up and read through now: take records.
    made.intake.caught_up.set()
    made.read_through.advance(time.time())
    yield made
    made.disk.close()


def _full(*_args: Any, **_kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _record(offset: int, tracker: SlotTracker, message_id: str = "m") -> SlotRecord:
    stored = StoredRecord(offset, 100_000, False, message_id, TARGET, None, 0, b"k", b"v", [])
    return SlotRecord.stored(stored, 0, tracker)


def _forward(worker: PreciseWorker, offset: int, tracker: SlotTracker) -> None:
    """Forward one record of the slot through the worker's forwarder, to its commit
    point, which settles it (on the forwarder's thread, which must go on)."""
    worker.wheel.buffer.schedule_many([(_record(offset, tracker), 0.0)])
    worker.forwarder.step(commit=True)


@pytest.mark.parametrize("marks_writer", [True, False])
def test_a_settled_mark_that_cannot_be_written_stops_the_daemon(worker, monkeypatch, marks_writer):
    """The marks writer writes the mark; with none running (stopped), the commit point
    does, on the forwarder's thread, which must go on."""
    worker.store.append(0, 100, b"frame")
    tracker = SlotTracker(0, 100)
    tracker.outstanding = 2
    worker.wheel._state.trackers[(0, 100)] = tracker
    writer = worker.wheel._state.marks_writer
    if marks_writer:
        writer.start()
    monkeypatch.setattr(slot_store, "_write_all", _full)
    _forward(worker, 7, tracker)  # one of two: a mark to write; must not raise
    wait_for(lambda: bool(worker.fatal), "the fault reported")
    if marks_writer:
        writer.join(5)
        assert not writer.is_alive()  # it stops on the fault, as the daemon does
    assert len(worker.fatal) == 1
    assert "storage fault in precise mode" in worker.fatal[0]
    assert "No space left on device" in worker.fatal[0]


def test_a_slot_that_cannot_be_deleted_stops_the_daemon_without_raising_into_the_forwarder(
    worker, monkeypatch
):
    worker.store.append(0, 100, b"frame")
    tracker = SlotTracker(0, 100)
    tracker.outstanding = 1
    worker.wheel._state.trackers[(0, 100)] = tracker
    monkeypatch.setattr(Path, "unlink", _full)
    _forward(worker, 7, tracker)  # the commit point settles it: must not raise
    assert len(worker.fatal) == 1
    assert "cannot delete slot" in worker.fatal[0]
    monkeypatch.undo()
    assert worker.store.size(0, 100) is not None  # still there for the restart


def test_a_fault_while_taking_records_stops_the_daemon_and_sends_nothing(worker, monkeypatch):
    """The forwarder's taker settles a cancelled record: its slot's deletion fails."""
    worker.store.append(0, 100, b"frame")
    tracker = SlotTracker(0, 100)
    tracker.outstanding = 1
    worker.wheel._state.trackers[(0, 100)] = tracker
    worker.wheel._state.cancelled_in_memory.add("gone")
    worker.wheel.buffer.schedule_many([(_record(7, tracker, "gone"), 0.0)])
    monkeypatch.setattr(Path, "unlink", _full)
    assert worker.wheel.buffer.take(10) == []  # what the forwarder gets: nothing
    assert len(worker.fatal) == 1
    assert "cannot delete slot" in worker.fatal[0]


def test_faults_while_stopping_change_nothing(worker, monkeypatch):
    worker.request_stop()
    monkeypatch.setattr(slot_store, "_write_all", _full)
    with pytest.raises(slot_store.SlotStoreError):
        worker.store.append(0, 100, b"frame")
    assert worker.fatal == []
