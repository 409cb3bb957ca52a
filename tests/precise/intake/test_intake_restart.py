"""Where a restarted intake reads from: the later of the broker's committed offset and
the one its data directory noted, and a batch it had in flight is read again before
the slots it may have written load. A record read again after a crash must not be sent
again from a new slot (issue 35: 1,761 and 1,813 extra copies of 2,990 messages)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, cast

from confluent_kafka import OFFSET_BEGINNING

from delayservice.precise.placement import Placement
from delayservice.precise.storage import slot_store
from delayservice.precise.wheel.wheel import Wheel
from tests.precise.intake_rig import FAR_MS, NOW_MS, Outcomes, Rig, record, running, wait


def _assigned(rig: Rig) -> list[tuple[int, int]]:
    rig.intake.start()
    assert wait(lambda: bool(rig.consumer.assigned))
    return rig.consumer.assigned[0]


def test_a_restart_whose_commits_never_reached_the_broker_resumes_after_what_is_on_disk(
    tmp_path: Path,
):
    """The broker says nothing was committed (a commit not landed before a kill, or
    offsets expired); the data directory holds offsets 0 to 2."""
    with running(tmp_path) as first:
        first.run_batch([record(o) for o in range(3)])
    again = Rig(tmp_path)
    again.consumer.ends = {0: 3}
    try:
        assert _assigned(again) == [(0, 3)]
    finally:
        again.stop()


def test_a_noted_offset_past_the_end_of_the_partition_is_not_trusted(tmp_path: Path):
    """The topic was deleted and made again: its offsets start over."""
    with running(tmp_path) as first:
        first.run_batch([record(o) for o in range(3)])
    again = Rig(tmp_path)
    again.consumer.ends = {0: 1}
    try:
        assert _assigned(again) == [(0, OFFSET_BEGINNING)]
    finally:
        again.stop()


def test_a_batch_in_flight_at_a_crash_is_read_again_before_its_slots_load(
    tmp_path: Path, monkeypatch: Any
):
    with running(tmp_path) as first:
        first.run_batch([record(0)])
        monkeypatch.setattr(slot_store.os, "fsync", _eio)  # a crash between write and commit
        first.feed([record(o) for o in range(1, 4)])
        assert first.intake.join(10)
    monkeypatch.undo()
    assert first.consumer.committed_offsets == {0: 1}
    assert first.intake_offsets.in_flight() == {0: 4}
    again = Rig(tmp_path)
    again.consumer.ends = {0: 4}
    released: list[int] = []
    monkeypatch.setattr(again.wheel, "read_again", released.append)
    try:
        assert _assigned(again) == [(0, 1)]
        assert released == []  # its slots wait: they may hold copies of 1 to 3
        again.run_batch([record(o) for o in range(1, 4)])
        assert wait(lambda: released == [0])
    finally:
        again.stop()
    assert again.intake_offsets.in_flight() == {}


def _eio(*_args: Any) -> None:
    raise OSError(errno.EIO, os.strerror(errno.EIO))


def test_a_cancel_read_in_a_batch_a_kill_left_uncommitted_still_calls_its_message_off(
    tmp_path: Path,
):
    """A message and its cancel in one batch: the message is written to its slot, the
    cancel to the log, and the process dies while the batch's replies wait, before its
    offsets commit. The next process reads the message again and finds its cancel, as
    if the cancel had come first; retiring the cancel then would let the copy already
    in the slot file out when it loads (3 of 20 acknowledged cancels leaked under
    exactly-once, whose replies wait for the forwarder's transaction)."""
    killed = Rig(tmp_path)
    killed.hold_answers = True
    killed.intake.start()
    try:
        killed.feed([record(0), record(1, cancel="id-0-0")])
        assert killed.answering.wait(10)
        assert killed.consumer.committed_offsets == {}
        assert "id-0-0" in killed.cancels
        with running(tmp_path) as again:  # the same data directory, read from the start
            again.run_batch([record(0), record(1, cancel="id-0-0")])
            again.run_batch([record(2)])  # committed past both: a cancel matched is retired
            assert "id-0-0" in again.cancels
        later = Rig(tmp_path)  # the data directory when the message falls due
        wheel = Wheel(
            later.store,
            later.cancels,
            later.reschedules,
            Placement(1, 0, 1),
            cast(Any, Outcomes()),
            lookahead_s=2.0,
            clock=lambda: (NOW_MS + FAR_MS) / 1000,
        )
        wheel.split_due_spans()
        wheel._loader.load_due_slots()
        loaded = [r.envelope.id for _, records in wheel.buffer.take(100) for r in records]
        assert loaded == ["id-0-2"]  # not id-0-0, cancelled
    finally:
        killed.release_answers.set()
        killed.stop()
