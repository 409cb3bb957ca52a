"""The reschedule log: which copy of each moved message is live, across restarts, a
torn last line and compaction, and when an entry may go."""

from __future__ import annotations

from pathlib import Path

import pytest

from delayservice.precise.storage.reschedule_log import Move, RescheduleLog, pending_moves


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "reschedules.log"


def reopen(log: RescheduleLog, path: Path) -> RescheduleLog:
    log.sync()
    log.close()
    return RescheduleLog(path)


def test_the_entry_names_the_live_copy_and_every_other_copy_is_superseded(path: Path) -> None:
    log = RescheduleLog(path)
    records = [("a", 5, False), ("a", 9, True), ("a", 12, True), ("b", 3, False), ("b", 7, True)]
    # No entry: only the message as first stored is live; a copy no entry names is an
    # orphan of a move that did not complete.
    assert log.superseded(records) == {("a", 9), ("a", 12), ("b", 7)}
    assert log.move("a", Move(due_ms=1000, version=9, hold_ms=5000, partition=0))
    assert log.superseded(records) == {("a", 5), ("a", 12), ("b", 7)}
    assert log.current("a") == Move(1000, 9, 5000, 0)
    assert log.current("b") is None


def test_entries_survive_a_restart_and_a_torn_last_line(path: Path) -> None:
    log = RescheduleLog(path)
    log.move("a", Move(1000, 9, 5000, 0))
    log.move("b", Move(2000, 11, 6000, 1))
    log.move("a", Move(3000, 15, 7000, 0))
    log = reopen(log, path)
    with path.open("ab") as file:
        file.write(b"+ 1 2 3")  # a crash in the middle of a line
    assert pending_moves(path) == {"a": Move(3000, 15, 7000, 0), "b": Move(2000, 11, 6000, 1)}
    again = RescheduleLog(path)
    assert again.current("a") == Move(3000, 15, 7000, 0)
    again.move("c", Move(1, 2, 3, 0))
    assert pending_moves(path)["c"] == Move(1, 2, 3, 0)


def test_an_entry_goes_once_its_partition_has_no_file_before_its_hold(path: Path) -> None:
    log = RescheduleLog(path)
    log.move("a", Move(1000, 9, 5_000, 0))
    log.move("b", Move(1000, 10, 9_000, 0))
    log.move("c", Move(1000, 11, 5_000, 1))
    assert log.expire({0: 5, 1: 2}) == 0  # files from second 5 and 2 may hold copies
    assert log.expire({0: 6, 1: 2}) == 1  # a's copies are all before second 6
    assert "a" not in log
    assert log.expire({0: 9}) == 1  # partition 1 has no file at all: c goes
    assert "c" not in log
    assert "b" in log
    log = reopen(log, path)
    assert set(pending_moves(path)) == {"b"}


def test_a_full_log_refuses_new_ids_but_moves_a_known_one(tmp_path: Path) -> None:
    log = RescheduleLog(tmp_path / "r.log", max_entries=2)
    assert log.move("a", Move(1, 1, 1, 0))
    assert log.move("b", Move(1, 2, 1, 0))
    assert not log.has_room("c")
    assert not log.move("c", Move(1, 3, 1, 0))
    assert log.has_room("a")
    assert log.move("a", Move(1, 4, 1, 0))
    assert log.current("a") == Move(1, 4, 1, 0)
