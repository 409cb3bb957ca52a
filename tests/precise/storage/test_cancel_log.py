"""The cancel log: a set that survives restarts, tolerates a torn last line, stays
small by compaction and round-trips any id."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delayservice.precise.storage import cancel_log
from delayservice.precise.storage.cancel_log import CancelLog, CancelLogError


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "cancels.log"


def reopen(log: CancelLog, path: Path) -> CancelLog:
    log.sync()
    log.close()
    return CancelLog(path)


def test_add_contains_matched(path: Path) -> None:
    log = CancelLog(path)
    assert "a" not in log
    assert log.add("a", 1000)
    assert log.add("b", 2000)
    assert "a" in log
    assert len(log) == 2
    log.matched("a")
    assert "a" not in log
    assert len(log) == 1
    log.matched("never-added")
    assert len(log) == 1
    assert 42 not in log


def test_among_names_the_cancelled_of_many_ids(path: Path) -> None:
    log = CancelLog(path)
    assert log.among(["a", "b"]) == set()
    log.add("a", 1000)
    log.add("c", 1000)
    assert log.among(iter(["a", "b", "c", "a"])) == {"a", "c"}
    log.matched("a")
    assert log.among(["a", "b", "c"]) == {"c"}


def test_expire_removes_only_entries_strictly_past(path: Path) -> None:
    log = CancelLog(path)
    log.add("early", 1000)
    log.add("late", 5000)
    log.add("exact", 3000)
    assert log.expire(999) == []
    assert sorted(log.expire(3000)) == ["early"]
    assert sorted(log.expire(3001)) == ["exact"]
    assert "late" in log
    assert len(log) == 1


def test_readding_with_a_later_expiry_extends_it(path: Path) -> None:
    log = CancelLog(path)
    log.add("a", 1000)
    log.add("a", 9000)
    log.add("a", 500)  # an older duplicate never shortens it
    assert log.expire(5000) == []
    assert "a" in log
    log = reopen(log, path)
    assert log.expire(5000) == []
    assert log.expire(9001) == ["a"]


def test_matched_then_expire_does_not_return_it(path: Path) -> None:
    log = CancelLog(path)
    log.add("a", 1000)
    log.matched("a")
    assert log.expire(10_000) == []


def test_persists_across_reopen(path: Path) -> None:
    log = CancelLog(path)
    log.add("keep", 10_000)
    log.add("matched", 10_000)
    log.add("expired", 10)
    log.matched("matched")
    log.expire(11)
    log = reopen(log, path)
    assert len(log) == 1
    assert "keep" in log
    assert "matched" not in log
    assert "expired" not in log
    assert log.expire(10_001) == ["keep"]
    log = reopen(log, path)
    assert len(log) == 0


def test_torn_last_line_is_dropped_and_cut(path: Path) -> None:
    log = CancelLog(path)
    log.add("a", 100)
    log.add("b", 200)
    log.sync()
    log.close()
    whole = path.read_bytes()
    with path.open("ab") as file:
        file.write(b"+ 300 6")  # the crash hit mid-line
    log = CancelLog(path)
    assert len(log) == 2
    assert path.read_bytes() == whole
    log.add("c", 300)
    log = reopen(log, path)
    assert len(log) == 3
    assert all(message_id in log for message_id in ("a", "b", "c"))


def test_unreadable_whole_lines_are_skipped(path: Path) -> None:
    path.write_bytes(b"+ 100 61\n? what\n+ zz 62\n+ 100 6g\n+ 200 63\n")
    log = CancelLog(path)
    assert len(log) == 2
    assert "a" in log
    assert "c" in log


def test_compaction_keeps_exactly_the_live_set(path: Path) -> None:
    log = CancelLog(path)
    live = {f"live-{n}": 1_000_000 + n for n in range(50)}
    for message_id, expires in live.items():
        log.add(message_id, expires)
    for n in range(cancel_log.COMPACT_MIN_DEAD):
        log.add(f"gone-{n}", 5)
        log.matched(f"gone-{n}")
    log.sync()
    lines = path.read_bytes().splitlines()
    assert len(lines) == len(live)  # rewritten: removals and their adds are gone
    log.add("after", 2_000_000)  # appends still reach the new file
    log = reopen(log, path)
    assert len(log) == len(live) + 1
    assert all(message_id in log for message_id in live)
    assert sorted(log.expire(1_000_025)) == sorted(f"live-{n}" for n in range(25))
    assert not path.with_name(path.name + ".tmp").exists()


def test_no_compaction_while_live_entries_dominate(path: Path) -> None:
    log = CancelLog(path)
    for n in range(6000):
        log.add(f"live-{n}", 10**9)
    for n in range(cancel_log.COMPACT_MIN_DEAD // 2 + 1):
        log.add(f"gone-{n}", 5)
        log.matched(f"gone-{n}")
    log.sync()  # dead > 10,000 but not more than twice the live 6,000
    assert len(path.read_bytes().splitlines()) == 6000 + 2 * (cancel_log.COMPACT_MIN_DEAD // 2 + 1)


def test_failed_compaction_keeps_the_log_usable(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = CancelLog(path)
    log.add("live", 10**9)
    for n in range(cancel_log.COMPACT_MIN_DEAD):
        log.add(f"gone-{n}", 5)
        log.matched(f"gone-{n}")

    def full(src: object, dst: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    log.sync()  # durable anyway; compaction waits for more dead lines
    monkeypatch.undo()
    log.add("after", 10**9)
    log = reopen(log, path)
    assert len(log) == 2
    assert "after" in log


def test_max_entries(path: Path) -> None:
    log = CancelLog(path, max_entries=2)
    assert log.add("a", 100)
    assert log.add("b", 100)
    assert not log.add("c", 100)
    assert "c" not in log
    assert log.add("a", 200)  # already known: an update, not a new entry
    log.matched("a")
    assert log.add("c", 100)
    log = reopen(log, path)
    assert {mid for mid in ("a", "b", "c") if mid in log} == {"b", "c"}


@settings(max_examples=50, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(), min_size=1, max_size=10, unique=True))
def test_any_id_round_trips(tmp_path: Path, ids: list[str]) -> None:
    path = tmp_path / f"ids-{os.urandom(6).hex()}.log"
    log = CancelLog(path)
    for message_id in ids:
        assert log.add(message_id, 100)
    log = reopen(log, path)
    assert all(message_id in log for message_id in ids)
    assert sorted(log.expire(101)) == sorted(ids)
    log.close()


@pytest.mark.parametrize(
    "message_id",
    ["", "with space", "two\nlines", "+ 5 61", "- 61", "tab\there", "ünï☃", "\udcff\udc80", "\x00"],
)
def test_awkward_ids_round_trip_and_cannot_forge_lines(path: Path, message_id: str) -> None:
    log = CancelLog(path)
    log.add(message_id, 100)
    log.add("a", 100)
    log = reopen(log, path)
    assert message_id in log
    assert "a" in log
    assert len(log) == 2
    log.matched(message_id)
    log = reopen(log, path)
    assert message_id not in log
    assert len(log) == 1


def test_write_failure_is_retriable_and_leaves_no_partial_line(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = CancelLog(path)
    log.add("a", 100)
    real_write = os.write

    def half(fd: int, data: bytes | memoryview) -> int:
        real_write(fd, bytes(data[:3]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half)
    with pytest.raises(CancelLogError) as caught:
        log.add("b", 100)
    assert caught.value.retriable
    assert str(path) in str(caught.value)
    assert "b" not in log
    monkeypatch.undo()
    log.add("c", 100)
    log = reopen(log, path)
    assert {mid for mid in ("a", "b", "c") if mid in log} == {"a", "c"}


def test_closed_log_refuses_changes(path: Path) -> None:
    log = CancelLog(path)
    log.close()
    with pytest.raises(CancelLogError, match="closed"):
        log.add("a", 1)
