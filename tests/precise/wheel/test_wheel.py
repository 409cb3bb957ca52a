"""The wheel's bookkeeping on a real slot directory, driven by an injected clock."""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from delayservice.envelope import Envelope
from delayservice.forward.forwarder import TAKE
from delayservice.precise.intake.offset_ledger import LevelLedger
from delayservice.precise.placement import Placement
from delayservice.precise.settle import settle_durable
from delayservice.precise.storage import slot_store
from delayservice.precise.storage.cancel_log import CancelLog
from delayservice.precise.storage.reschedule_log import RescheduleLog
from delayservice.precise.storage.slot_file import StoredRecord, encode
from delayservice.precise.storage.slot_index import SlotIndex
from delayservice.precise.storage.slot_record import SlotRecord
from delayservice.precise.storage.slot_store import SlotStore
from delayservice.precise.wheel.slot_ledger import SlotTracker
from delayservice.precise.wheel.wheel import Wheel

NOW = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


class Outcomes:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def cancelled(self, outcome: str, count: int = 1) -> None:
        self.counts[outcome] += count

    def cleaned(self) -> None:
        self.counts["cleaned"] += 1

    def took_over(self) -> None:
        self.counts["took_over"] += 1


class Coverage:
    def __init__(self) -> None:
        self.done: set[int] = set()
        self.ready = True

    def covers(self, partition: int, offset: int, due_ms: int) -> bool:
        return offset in self.done


class Rig:
    def __init__(
        self,
        root: Path,
        placement: Placement | None = None,
        now: float = NOW,
        unread: tuple[int, ...] = (),
        **options: int,
    ) -> None:
        """`options`: the wheel's `horizon_s` and `max_buffered_bytes`; `unread` its
        partitions with a batch to read again."""
        self.unread = unread
        self.clock = Clock()
        self.clock.now = now
        self.store = SlotStore(root / "slots")
        self.cancels = CancelLog(root / "cancels.log")
        self.reschedules = RescheduleLog(root / "reschedules.log")
        self.outcomes = Outcomes()
        self.coverage = Coverage()
        self.options = options
        self.wheel = self.new_wheel(placement or Placement(1, 0, 1))

    def new_wheel(self, placement: Placement) -> Wheel:
        return Wheel(
            self.store,
            self.cancels,
            self.reschedules,
            placement,
            self.outcomes,
            lookahead_s=5.0,
            takeover_s=3.0,
            coverage=self.coverage,
            clock=self.clock,
            unread=self.unread,
            **self.options,
        )

    def stored(self, offset: int, due_ms: int, replica: bool = False) -> StoredRecord:
        return StoredRecord(
            offset, due_ms, replica, f"id-{offset}", "target", None, 0, b"k", b"v", [("h", b"1")]
        )

    def append(
        self,
        offset: int,
        due_ms: int,
        partition: int = 0,
        replica: bool = False,
        sync: bool = True,
    ) -> None:
        """What the intake does for one record, including the buffering after the sync
        (which the intake does once per batch: `sync=False` for all but a batch's last)."""
        stored = self.stored(offset, due_ms, replica)
        fire_ms = due_ms + (3000 if replica else 0)
        tracker = self.wheel.append(partition, fire_ms, encode(stored))
        if sync:
            self.store.sync()
        if tracker is not None:
            record = SlotRecord(
                partition,
                offset,
                b"k",
                b"v",
                [("h", b"1")],
                Envelope("target", 0, f"id-{offset}"),
                due_ms,
                tracker,
            )
            self.wheel.admit([(record, fire_ms / 1000)])

    def take(self) -> list[int]:
        """Offsets the forwarder would send now; each is settled as if made durable."""
        records = [r for _, run in self.wheel.buffer.take(TAKE) for r in run]
        for record in records:
            assert isinstance(record.slot, SlotTracker)
            self.wheel.settled(record.slot, record.offset())
        return [r.offset() for r in records]

    def files(self) -> int:
        return len(self.store.slots())


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


def ms(seconds: float) -> int:
    return int((NOW + seconds) * 1000)


def test_far_slots_stay_on_disk_until_the_pointer_comes_near(rig):
    rig.append(1, ms(60))
    rig.append(2, ms(2))
    rig.append(3, ms(90), partition=1)
    assert rig.store.earliest() == {0: ms(2) // 1000, 1: ms(90) // 1000}
    assert len(rig.wheel.buffer) == 1  # only the near one is in memory
    assert rig.wheel.disk_slots == 3
    assert rig.wheel.loaded_slots == 1
    rig.clock.now = NOW + 56
    # The loader's step: loads the slot now in reach, says when the next one is.
    assert rig.wheel._loader.load_due_slots() == pytest.approx(29.0, abs=0.01)
    assert len(rig.wheel.buffer) == 2


def test_records_leave_in_due_order_never_early_and_the_file_goes_with_the_last(rig):
    rig.append(1, ms(1.5))
    rig.append(2, ms(1.2))
    rig.append(3, ms(1.9))
    rig.clock.now = NOW + 1.3
    assert rig.take() == [2]
    assert rig.files() == 1
    rig.clock.now = NOW + 2
    assert rig.take() == [1, 3]
    assert rig.files() == 0


def test_a_slot_read_back_after_a_restart_drops_offsets_written_twice(rig, tmp_path):
    for offset in (1, 2, 2, 3, 1):  # re-read after a crash between write and commit
        rig.append(offset, ms(30))
    rig.store.close()
    rig.cancels.close()
    again = Rig(tmp_path)
    again.clock.now = NOW + 30
    again.wheel._loader.load_due_slots()
    assert again.take() == [1, 2, 3]
    assert again.files() == 0


def test_a_restart_does_not_resend_what_a_half_forwarded_slot_already_sent(rig, tmp_path):
    for offset, due in ((1, 1.1), (2, 1.5), (3, 1.9)):
        rig.append(offset, ms(due))
    rig.clock.now = NOW + 1.6
    assert rig.take() == [1, 2]  # acknowledged; the slot still waits for 3
    assert rig.files() == 1
    rig.wheel.write_marks()  # what the loader does every 50 ms
    rig.store.close()  # the process dies here: the file stays as it is
    rig.cancels.close()
    again = Rig(tmp_path)
    again.clock.now = NOW + 2
    again.wheel._loader.load_due_slots()
    assert again.take() == [3]
    assert again.files() == 0


def test_a_big_slot_loads_earlier_by_its_size(rig):
    for offset in range(200):
        rig.append(offset, ms(40), partition=1, sync=offset == 199)
    rig.append(1000, ms(38), partition=2)
    size = rig.store.size(1, int(ms(40) // 1000))
    lead = size / 10_000_000
    rig.clock.now = NOW + 40 - 5 - lead - 0.001
    rig.wheel._loader.load_due_slots()
    assert rig.wheel.loaded_slots == 1  # the small one at 38 s is in reach, the big one not yet
    rig.clock.now = NOW + 40 - 5 - lead + 0.001
    rig.wheel._loader.load_due_slots()
    assert rig.wheel.loaded_slots == 2


def test_the_forwarder_takes_a_burst_a_chunk_at_a_time(rig):
    for offset in range(TAKE + 10):
        rig.append(offset, ms(1), sync=offset == TAKE + 9)
    rig.clock.now = NOW + 1
    assert len(rig.take()) == TAKE
    assert len(rig.take()) == 10


def test_a_cancel_of_a_loaded_record_stops_it_and_is_counted(rig):
    rig.append(1, ms(2))
    assert rig.wheel.cancel("id-1", ms(100)) == "pending"
    rig.clock.now = NOW + 3
    assert rig.take() == []
    assert rig.outcomes.counts["cancelled"] == 1
    assert rig.files() == 0
    assert "id-1" in rig.cancels  # until the deletion is known durable
    rig.wheel.write_marks()  # the loader's next round syncs, then retires it
    assert "id-1" not in rig.cancels  # it did its job


def test_a_cancel_of_a_record_on_disk_applies_when_its_slot_loads(rig):
    rig.append(1, ms(60))
    rig.append(2, ms(60))
    assert rig.wheel.cancel("id-1", ms(1000)) == "pending"
    rig.clock.now = NOW + 60
    rig.wheel._loader.load_due_slots()
    assert rig.take() == [2]
    assert rig.outcomes.counts["cancelled"] == 1


def _restart(rig: Rig, tmp_path: Path, now: float) -> Rig:
    """The process dies: files stay as they are, nothing more is written."""
    rig.store.close()
    rig.cancels.close()
    again = Rig(tmp_path)
    again.clock.now = now
    again.wheel._loader.load_due_slots()
    return again


def test_a_record_settled_at_a_commit_point_is_not_sent_again_after_a_kill(rig, tmp_path):
    """Its settled mark is in the slot file once the commit point has settled it, not
    only after the loader's next pass (every 50 ms, later while it reads a slot in)."""
    rig.append(1, ms(1.2))
    rig.append(2, ms(1.8))
    rig.clock.now = NOW + 1.5
    assert rig.take() == [1]  # settled as the commit point does; 2 keeps the slot
    again = _restart(rig, tmp_path, NOW + 2)
    assert again.take() == [2]


class KilledInWriteError(Exception):
    """What a `SlowDisk` write raises once the process it stands in for was killed."""


class SlowDisk:
    """Writes to slot files that wait, once `armed`, until `release`d (a disk that
    stalls, or the kernel throttling a writer behind dirty pages)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed = False
        self.killed = False
        """The process dies in the write: the write never lands."""
        self.writing = threading.Event()
        self.release = threading.Event()
        real = slot_store._write_all

        def write_all(fd: int, data: bytes) -> None:
            if self.armed:
                self.writing.set()
                self.release.wait(10)
                if self.killed:
                    raise KilledInWriteError
            real(fd, data)

        monkeypatch.setattr(slot_store, "_write_all", write_all)


def _settle_taken(rig: Rig) -> list[int]:
    """`Rig.take`, settled the way a commit point settles (in one call)."""
    records = [r for _, run in rig.wheel.buffer.take(TAKE) for r in run]
    rig.wheel.settle_many([(r.slot, r.offset()) for r in records])  # type: ignore[misc]
    return [r.offset() for r in records]


def _in_thread(call: functools.partial[list[int]], timeout: float = 1.0) -> list[int] | None:
    """What `call` returned, or None when it did not return within `timeout`."""
    out: list[list[int]] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(timeout)
    return out[0] if out else None


def test_a_slow_mark_write_holds_up_neither_the_commit_point_nor_the_next_take(
    rig, tmp_path, monkeypatch
):
    """Issue 46: the settled marks a commit point gathers are written by the marks
    writer, not on the forwarder's thread; a write that stalls delays no forward."""
    disk = SlowDisk(monkeypatch)
    for offset, due in ((1, 1.2), (2, 1.4), (3, 1.8)):
        rig.append(offset, ms(due))
    rig.wheel.start()
    try:
        disk.armed = True
        rig.clock.now = NOW + 1.3
        assert _in_thread(functools.partial(_settle_taken, rig)) == [1]
        assert disk.writing.wait(5)  # the writer is at it, and stalls
        rig.clock.now = NOW + 1.5
        assert _in_thread(functools.partial(_settle_taken, rig)) == [2]
    finally:
        disk.release.set()
        rig.wheel.stop(5)  # its last pass writes what is left
    assert not rig.wheel._state.marks
    again = _restart(rig, tmp_path, NOW + 2)
    assert again.take() == [3]  # 1 and 2 were marked, by the writer


def test_the_marks_writer_writes_at_once_while_the_loader_reads_a_slot_in(
    rig, tmp_path, monkeypatch
):
    """The duplicate bound of a kill -9 (e1d920d): a commit point's marks reach the slot
    file within moments, not at the loader's next pass, which waits while it indexes
    a big slot."""
    rig.append(1, ms(1.2))
    rig.append(2, ms(1.8))
    rig.append(9, ms(6))  # past the look-ahead: on disk, loaded once it comes near
    indexing, done = threading.Event(), threading.Event()
    real_offsets = SlotIndex.offsets

    def slow_offsets(self: SlotIndex) -> set[int]:
        indexing.set()
        done.wait(10)
        return real_offsets(self)

    monkeypatch.setattr(SlotIndex, "offsets", slow_offsets)
    rig.clock.now = NOW + 1.5
    rig.wheel.start()
    try:
        assert indexing.wait(5)  # the loader is busy reading a slot in
        assert _settle_taken(rig) == [1]
        deadline = time.monotonic() + 5
        while rig.wheel._state.marks and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not rig.wheel._state.marks  # written while the loader still indexes
        assert not done.is_set()
    finally:
        done.set()
        rig.wheel.stop(5)
    again = _restart(rig, tmp_path, NOW + 2)
    assert again.take() == [2]


@pytest.mark.parametrize("marks_written", [False, True])
def test_a_cancel_matched_as_its_slot_loads_survives_a_kill(rig, tmp_path, marks_written):
    for offset in (1, 2, 3):
        rig.append(offset, ms(60))
    assert rig.wheel.cancel("id-2", ms(1000)) == "pending"
    rig.cancels.sync()
    rig.clock.now = NOW + 56
    rig.wheel._loader.load_due_slots()  # matched in memory; the slot still waits for 1 and 3
    if marks_written:
        rig.wheel.write_marks()
        assert "id-2" not in rig.cancels  # the mark is durable: the cancel may go
    again = _restart(rig, tmp_path, NOW + 61)
    assert again.take() == [1, 3]
    assert again.files() == 0


@pytest.mark.parametrize("marks_written", [False, True])
def test_a_cancel_of_a_record_in_memory_survives_a_kill(rig, tmp_path, marks_written):
    for offset, due in ((1, 1.2), (2, 1.5), (3, 1.9)):
        rig.append(offset, ms(due))
    assert rig.wheel.cancel("id-2", ms(1000)) == "pending"
    rig.cancels.sync()
    rig.clock.now = NOW + 1.6
    assert rig.take() == [1]  # 2 is called off; the slot still waits for 3
    if marks_written:
        rig.wheel.write_marks()  # 2's mark, and its cancel retired
    again = _restart(rig, tmp_path, NOW + 2)
    # 1's mark was written as it settled, before any loader pass; 2 never goes: its
    # mark is on disk, or its cancel still in the log.
    assert again.take() == [3]
    assert again.files() == 0


def test_a_cancel_after_the_record_was_sent_is_too_late(rig):
    rig.append(1, ms(1))
    rig.clock.now = NOW + 1
    assert rig.take() == [1]
    assert rig.wheel.cancel("id-1", ms(100)) == "too_late"
    assert "id-1" not in rig.cancels


def test_a_cancel_that_finds_nothing_expires_as_unmatched(rig):
    assert rig.wheel.cancel("nobody", ms(10)) == "pending"
    rig.clock.now = NOW + 11
    rig.wheel._expire_cancels()
    assert rig.outcomes.counts["unmatched"] == 1


def test_a_replica_copy_is_cleaned_when_reported_and_taken_over_when_not(tmp_path):
    rig = Rig(tmp_path, Placement(2, 1, 2))  # member 1 is the replica of partition 0
    rig.append(1, ms(1), partition=0, replica=True)
    rig.append(2, ms(1), partition=0, replica=True)
    rig.coverage.done.add(1)  # the owner reported offset 1 done
    rig.clock.now = NOW + 3.5
    assert rig.take() == []  # not before due + takeover delay
    rig.clock.now = NOW + 4
    assert rig.take() == [2]
    assert rig.outcomes.counts == Counter({"cleaned": 1, "took_over": 1})
    assert rig.files() == 0


def test_an_owner_sends_overdue_records_only_if_its_replica_has_not_reported_them(rig):
    rig.append(1, ms(1))
    rig.append(2, ms(1.5))
    rig.append(3, ms(9))
    rig.coverage.done.update({1, 3})  # the replica took 1 over; 3 is its own business
    rig.clock.now = NOW + 5  # back after an outage: 1 and 2 are overdue past the takeover
    rig.wheel._loader.load_due_slots()
    assert rig.take() == [2]
    assert rig.outcomes.counts == Counter({"cleaned": 1})
    rig.clock.now = NOW + 9
    assert rig.take() == [3]  # on time: sent, whatever the replica says


def test_copies_that_need_the_other_holders_word_wait_until_it_is_read(tmp_path):
    rig = Rig(tmp_path, Placement(2, 1, 2))
    rig.append(1, ms(1), partition=0, replica=True)
    rig.coverage.ready = False
    rig.coverage.done.add(1)
    rig.clock.now = NOW + 4
    assert rig.take() == []  # not taken over, not dropped: asked again shortly
    assert len(rig.wheel.buffer) == 1
    rig.coverage.ready = True
    rig.clock.now = NOW + 4.5
    assert rig.take() == []
    assert rig.outcomes.counts == Counter({"cleaned": 1})
    assert rig.files() == 0


def test_a_slot_being_loaded_is_not_deleted_by_settles_of_its_newer_records(rig):
    rig.append(1, ms(30))
    rig.clock.now = NOW + 20
    rig.wheel._loader.load_due_slots()  # not in reach yet, but near: off the heap
    rig.clock.now = NOW + 28
    # The loader has claimed the slot (size snapshot) when the intake appends to it.
    with rig.wheel._state.lock:
        key = (0, int(ms(30) // 1000))
        rig.wheel._state.near.remove((key[1], key[0]))
        tracker = rig.wheel._state.trackers[key] = SlotTracker(*key)
        tracker.loading = True
        size = rig.store.size(*key)
    rig.append(2, ms(29.5))  # same slot second, goes to memory
    rig.clock.now = NOW + 29.6
    assert rig.take() == [2]
    assert rig.files() == 1  # the older record is still on disk, not yet in memory
    read_at = functools.partial(rig.store.read_at, (*key, 1))
    rig.wheel._state.loading[tracker] = SlotIndex(read_at, size or 0, key[1], 3000)
    rig.wheel._loader.fill()
    rig.clock.now = NOW + 30
    assert rig.take() == [1]
    assert rig.files() == 0


class SlotsSettled:
    def __init__(self) -> None:
        self.done: list[tuple[SlotTracker, int]] = []

    def settle_many(
        self, done: list[tuple[SlotTracker, int]], then: Callable[[], None] | None = None
    ) -> None:
        self.done.extend(done)
        if then is not None:
            then()


def test_the_settle_protocol_settles_slots_and_intake_offsets_apart():
    wheel = SlotsSettled()
    offsets = LevelLedger()
    intake = offsets.assign(0)
    offsets.track(intake, 7, 0)
    tracker = SlotTracker(0, 123)
    envelope = Envelope("target", 0, "id")
    in_slot = SlotRecord(0, 5, None, None, [], envelope, 0, tracker)
    dead_letter = SlotRecord(0, 7, None, None, [], None, 0, intake, ("invalid_envelope", "x"))
    settle_durable([(0, [in_slot])], wheel=wheel, offsets=offsets)
    assert wheel.done == [(tracker, 5)]
    assert offsets.to_commit() == [(0, 7)]  # the intake record is not settled by that
    settle_durable([(0, [dead_letter])], wheel=wheel, offsets=offsets)  # made durable
    assert offsets.to_commit() == [(0, 8)]
    assert wheel.done == [(tracker, 5)]
