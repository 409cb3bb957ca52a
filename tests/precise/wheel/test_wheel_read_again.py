"""A record the intake reads again after a crash (its batch not committed) is held once."""

from __future__ import annotations

from pathlib import Path

import pytest

from delayservice.precise.storage.slot_file import encode
from delayservice.precise.storage.slot_index import SlotIndex
from delayservice.precise.wheel import slot_loading
from tests.precise.wheel.test_wheel import NOW, Rig, ms


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


def _killed(rig: Rig, tmp_path: Path, now: float, unread: tuple[int, ...] = ()) -> Rig:
    """The process dies: files stay as they are (page cache), nothing more is written."""
    rig.store.close()
    rig.cancels.close()
    return Rig(tmp_path, now=now, unread=unread)


def test_a_record_read_again_into_a_loaded_slot_is_held_once(rig, tmp_path):
    rig.append(1, ms(60))
    rig.append(2, ms(60.5))
    again = _killed(rig, tmp_path, NOW + 57)
    again.wheel._loader.load_due_slots()  # the slot is in memory, from its file
    again.append(1, ms(60))  # the intake reads record 1 again: its commit was lost
    again.clock.now = NOW + 61
    assert again.take() == [1, 2]
    assert again.files() == 0


def test_a_record_read_again_while_its_slot_is_indexed_is_held_once(rig, tmp_path, monkeypatch):
    """The loader indexes a slot's file outside the wheel's lock: the intake may hand the
    same record in meanwhile. The copy handed in is held, the file's is left out."""
    rig.append(1, ms(60))
    rig.append(2, ms(60.5))
    again = _killed(rig, tmp_path, NOW + 57)

    def indexing(*args: object, **kwargs: object) -> SlotIndex:
        again.append(1, ms(60))  # read again while the file is being indexed
        return SlotIndex(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(slot_loading, "SlotIndex", indexing)
    again.wheel._loader.load_due_slots()
    again.clock.now = NOW + 61
    assert again.take() == [1, 2]
    assert again.files() == 0


def test_a_slot_sent_before_the_batch_in_flight_at_a_kill_is_read_again_stays_until_then(
    rig, tmp_path
):
    """Record 1 was written (its slot due at once) but its batch never committed. Its
    slot loads at the restart and sends it at once; had the slot gone with it, the copy
    the intake reads again would go out a second time from a new slot."""
    frame = encode(rig.stored(1, ms(1)))
    rig.wheel.append_many([(0, ms(1), frame)])  # written, never buffered: killed first
    rig.store.sync()
    again = _killed(rig, tmp_path, NOW + 3, unread=(0,))
    again.wheel._loader.load_due_slots()
    assert again.take() == [1]  # not held back by the batch to read again
    assert again.files() == 1
    again.append(1, ms(1))  # read again: its slot holds it already
    assert again.take() == []
    again.wheel.read_again(0)
    assert again.files() == 0
