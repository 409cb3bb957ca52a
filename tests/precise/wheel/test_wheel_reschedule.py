"""Reschedules in the wheel, on a real slot directory with an injected clock: a moved
message goes out once, at its new time, whatever it crosses (memory, disk, a span, a
restart, a split under way, a cancel)."""

from __future__ import annotations

from pathlib import Path

import pytest

from delayservice.forward.forwarder import TAKE
from delayservice.precise.storage.slot_file import StoredRecord, encode
from delayservice.precise.wheel import reschedule_moves as wheel_module
from delayservice.precise.wheel.reschedule_moves import READ_AGAIN, Reschedule
from delayservice.precise.wheel.slot_ledger import SlotTracker
from tests.precise.wheel.test_wheel import NOW, Rig, ms


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


def move(rig: Rig, message_id: str, version: int, due_s: float, partition: int = 0) -> str:
    """What the intake does with one reschedule marker at offset `version`: the move,
    then (after its commit) the copy into memory when its slot is there."""
    due = ms(due_s)
    ((outcome, copy),) = rig.wheel.move_many(
        [Reschedule(message_id, partition, version, due, False, due)]
    )
    if copy is not None:
        rig.wheel.admit([(copy, due / 1000)])
    return outcome


def sent(rig: Rig, at: float) -> list[tuple[str, int, int]]:
    """(id, offset, due ms) of what the forwarder sends at `at`, loading first; each is
    settled as if made durable."""
    rig.clock.now = at
    while rig.wheel.split_due_spans():  # spans this time has reached become slots
        pass
    rig.wheel._loader.load_due_slots()
    records = [r for _, run in rig.wheel.buffer.take(TAKE) for r in run]
    out = []
    for record in records:
        assert isinstance(record.slot, SlotTracker)
        rig.wheel.settled(record.slot, record.offset())
        assert record.envelope is not None
        out.append((record.envelope.id, record.offset(), record.due_ms))
    return out


def restart(rig: Rig, tmp_path: Path) -> Rig:
    """The process dies: files stay as they are, nothing more is written."""
    rig.wheel.write_marks()
    rig.store.close()
    rig.cancels.close()
    rig.reschedules.close()
    again = Rig(tmp_path)
    again.clock.now = rig.clock.now
    return again


def test_a_message_in_memory_moved_later_leaves_once_at_its_new_time(rig):
    rig.append(1, ms(2))
    assert move(rig, "id-1", 50, 30) == "moved"
    assert sent(rig, NOW + 3) == []
    assert sent(rig, NOW + 29.9) == []
    assert sent(rig, NOW + 30) == [("id-1", 50, ms(30))]
    assert sent(rig, NOW + 60) == []
    assert rig.files() == 0


def test_a_message_on_disk_moved_earlier_leaves_at_its_new_time_and_not_again(rig):
    rig.append(1, ms(600))
    rig.append(2, ms(600))
    assert move(rig, "id-1", 50, 2) == "moved"
    assert sent(rig, NOW + 1.9) == []
    assert sent(rig, NOW + 2) == [("id-1", 50, ms(2))]
    assert [s[0] for s in sent(rig, NOW + 600)] == ["id-2"]
    assert rig.files() == 0


def test_the_copy_keeps_key_value_headers_and_target(rig):
    rig.append(1, ms(600))
    assert move(rig, "id-1", 50, 2) == "moved"
    rig.clock.now = NOW + 2
    (record,) = [r for _, run in rig.wheel.buffer.take(TAKE) for r in run]
    assert (record.key(), record.value(), record.user) == (b"k", b"v", [("h", b"1")])
    assert record.envelope is not None
    assert record.envelope.target == "target"


def test_a_message_in_a_span_moved_near_and_one_moved_from_near_into_a_span(tmp_path):
    rig = Rig(tmp_path, horizon_s=3600)
    rig.append(1, ms(10 * 86_400))  # ten days out: a span file
    rig.append(2, ms(3))
    assert rig.store.spans()
    assert move(rig, "id-1", 50, 4) == "moved"
    assert move(rig, "id-2", 51, 5 * 86_400) == "moved"
    assert sent(rig, NOW + 4) == [("id-1", 50, ms(4))]
    assert sent(rig, NOW + 5 * 86_400) == [("id-2", 51, ms(5 * 86_400))]
    assert sent(rig, NOW + 10 * 86_400) == []


def test_two_moves_of_one_id_in_one_batch_the_later_marker_wins(rig):
    rig.append(1, ms(600))
    due = ms(20)
    later = ms(40)
    results = rig.wheel.move_many(
        [
            Reschedule("id-1", 0, 50, due, False, due),
            Reschedule("id-1", 0, 51, later, False, later),
        ]
    )
    assert [outcome for outcome, _ in results] == ["moved", "moved"]
    assert sent(rig, NOW + 20) == []
    assert sent(rig, NOW + 40) == [("id-1", 51, later)]
    assert sent(rig, NOW + 600) == []


def test_moves_in_later_batches_supersede_earlier_ones(rig):
    rig.append(1, ms(600))
    assert move(rig, "id-1", 50, 2) == "moved"
    assert move(rig, "id-1", 51, 300) == "moved"
    assert move(rig, "id-1", 52, 100) == "moved"
    assert sent(rig, NOW + 2) == []
    assert sent(rig, NOW + 100) == [("id-1", 52, ms(100))]
    assert sent(rig, NOW + 300) == []
    assert sent(rig, NOW + 600) == []


def test_a_marker_read_again_or_overtaken_does_nothing(rig):
    rig.append(1, ms(600))
    assert move(rig, "id-1", 51, 100) == "moved"
    assert move(rig, "id-1", 51, 100) == READ_AGAIN  # read again after a restart
    assert move(rig, "id-1", 50, 200) == READ_AGAIN  # an older marker
    assert sent(rig, NOW + 100) == [("id-1", 51, ms(100))]
    assert sent(rig, NOW + 600) == []


def test_cancels_win_whichever_comes_first(rig):
    rig.append(1, ms(600))
    rig.append(2, ms(600))
    assert rig.wheel.cancel("id-1", ms(10_000)) == "pending"
    assert move(rig, "id-1", 50, 5) == "cancelled"
    assert move(rig, "id-2", 51, 5) == "moved"
    assert rig.wheel.cancel("id-2", ms(10_000)) == "pending"
    assert sent(rig, NOW + 5) == []
    assert sent(rig, NOW + 600) == []
    assert rig.files() == 0


def test_a_move_after_the_message_was_sent_is_too_late_and_one_for_nothing_unmatched(rig):
    rig.append(1, ms(2))
    assert sent(rig, NOW + 2) == [("id-1", 1, ms(2))]
    assert move(rig, "id-1", 50, 30) == "too_late"
    assert move(rig, "id-404", 51, 30) == "unmatched"
    assert sent(rig, NOW + 30) == []
    assert len(rig.reschedules) == 0


def test_a_copy_is_taken_when_due_even_if_the_old_one_was_in_the_buffer(rig):
    """The old copy sits in the forwarder's buffer, due, when the move lands: it is
    settled unsent at its take, and only the new copy goes."""
    rig.append(1, ms(2))
    rig.clock.now = NOW + 2.5  # due, not taken yet
    assert move(rig, "id-1", 50, 2.6) == "moved"
    assert sent(rig, NOW + 2.5) == []
    assert sent(rig, NOW + 2.6) == [("id-1", 50, ms(2.6))]


@pytest.mark.parametrize("moved_to", [5.0, 900.0])
def test_a_restart_after_a_move_sends_the_live_copy_only(rig, tmp_path, moved_to):
    rig.append(1, ms(300))
    rig.append(2, ms(300))
    assert move(rig, "id-1", 50, moved_to) == "moved"
    again = restart(rig, tmp_path)
    got = sent(again, NOW + 300) + sent(again, NOW + 900)
    assert sorted(got) == sorted([("id-2", 2, ms(300)), ("id-1", 50, ms(moved_to))])


def test_a_copy_no_entry_names_is_never_sent_and_the_marker_read_again_moves_once(rig, tmp_path):
    """A crash after the copy was written and before its entry: the copy is an orphan,
    the old copy stays live, and the marker read again makes the same copy live."""
    rig.append(1, ms(300))
    orphan = StoredRecord(
        50, ms(30), False, "id-1", "target", None, 0, b"k", b"v", [("h", b"1")], True
    )
    rig.wheel.append(0, ms(30), encode(orphan))
    rig.store.sync()
    again = restart(rig, tmp_path)
    assert sent(again, NOW + 30) == []  # the orphan
    assert move(again, "id-1", 50, 30) == "moved"
    assert sent(again, NOW + 30.5) == [("id-1", 50, ms(30))]
    assert sent(again, NOW + 300) == []


def test_an_entry_is_forgotten_once_no_file_can_hold_a_copy(rig):
    rig.append(1, ms(600))
    rig.append(2, ms(700))
    assert move(rig, "id-1", 50, 10) == "moved"
    assert sent(rig, NOW + 10) == [("id-1", 50, ms(10))]
    rig.wheel._expire_cancels()
    assert "id-1" in rig.reschedules  # its old copy's file is still there
    assert sent(rig, NOW + 600) == []
    rig.wheel._expire_cancels()
    assert "id-1" not in rig.reschedules


def test_a_move_during_a_split_finds_the_message_in_the_finer_file(tmp_path, monkeypatch):
    """The span is split between the search and the lock: the search is repeated."""
    rig = Rig(tmp_path, horizon_s=3600)
    rig.append(1, ms(30 * 3600))
    real = wheel_module.find_copies
    calls = []

    def split_first(files, read_at, ids):
        if not calls:
            rig.clock.now = NOW + int(29.5 * 3600)
            assert rig.wheel.split_due_spans()
        calls.append(1)
        return real(files, read_at, ids)

    monkeypatch.setattr(wheel_module, "find_copies", split_first)
    rig.clock.now = NOW + int(29.5 * 3600)
    assert move(rig, "id-1", 50, int(29.5 * 3600) + 60) == "moved"
    assert len(calls) == 2
    assert sent(rig, NOW + int(29.5 * 3600) + 60) == [("id-1", 50, ms(int(29.5 * 3600) + 60))]
    assert sent(rig, NOW + 30 * 3600) == []


def test_a_replica_copy_moves_with_the_takeover_delay(tmp_path):
    rig = Rig(tmp_path)
    rig.append(1, ms(600), replica=True)
    due = ms(20)
    ((outcome, _),) = rig.wheel.move_many([Reschedule("id-1", 0, 50, due, True, due + 3000)])
    assert outcome == "moved"
    rig.coverage.ready = True
    assert sent(rig, NOW + 22.9) == []
    assert sent(rig, NOW + 23) == [("id-1", 50, due)]  # taken over: the owner said nothing
    assert sent(rig, NOW + 603) == []


def test_the_copies_are_durable_before_any_entry_names_them(rig, monkeypatch):
    """Otherwise a machine crash could keep an entry whose copy was lost: every other
    copy would then count as stale, and the message would never leave."""
    rig.append(1, ms(600))
    calls: list[str] = []
    real_sync, real_move, real_log_sync = rig.store.sync, rig.reschedules.move, rig.reschedules.sync
    monkeypatch.setattr(rig.store, "sync", lambda: (calls.append("copies synced"), real_sync()))
    monkeypatch.setattr(
        rig.reschedules, "move", lambda *a: (calls.append("entry"), real_move(*a))[1]
    )
    monkeypatch.setattr(
        rig.reschedules, "sync", lambda: (calls.append("entries synced"), real_log_sync())
    )
    assert move(rig, "id-1", 50, 20) == "moved"
    assert calls == ["copies synced", "entry", "entries synced"]
