"""An unexpected error while a batch is handled (not one record's, not the disk's) must
not leave that batch behind: the intake reads it again from its first record. Before,
it read on past it, so those records stayed undelivered and every later commit of the
partition stayed held back until a restart."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from delayservice.precise.storage.slot_file import decode
from tests.precise.intake_rig import Rig, record, running, wait


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with running(tmp_path) as made:
        yield made


def _once(real: Callable[..., Any], error: Exception) -> Callable[..., Any]:
    calls = {"n": 0}

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise error
        return real(*args, **kwargs)

    return flaky


def _stored_ids(root: Path) -> list[str]:
    return sorted(
        held.message_id
        for path in (root / "slots").rglob("*")
        if path.is_file()
        for held in decode(path.read_bytes())[0]
    )


def test_a_batch_whose_write_failed_is_read_again_and_committed(rig, monkeypatch):
    rig.run_batch([record(o) for o in range(3)])
    wheel = rig.intake._wheel
    monkeypatch.setattr(wheel, "append_many", _once(wheel.append_many, RuntimeError("bug")))
    rig.feed([record(o) for o in range(3, 8)])
    assert wait(lambda: rig.consumer.committed_offsets.get(0) == 8), rig.consumer.committed_offsets
    assert rig.consumer.seeks == [(0, 3)]
    assert rig.intake.is_alive()
    assert rig.fatal == []
    assert _stored_ids(rig.root) == sorted(f"id-0-{o}" for o in range(8))
    assert rig.dead.submitted == []


def test_a_batch_that_failed_after_its_write_is_stored_again_not_lost(rig, monkeypatch):
    """Written, not yet settled: read again, it is written twice (a slot drops the
    repeated offset when it loads) and committed once durable."""
    rig.run_batch([record(0)])
    check = rig.intake._check_storage
    monkeypatch.setattr(rig.intake, "_check_storage", _once(check, ValueError("bug")))
    rig.feed([record(1), record(2)])
    assert wait(lambda: rig.consumer.committed_offsets.get(0) == 3), rig.consumer.committed_offsets
    assert rig.consumer.seeks == [(0, 1)]
    stored = _stored_ids(rig.root)
    assert set(stored) == {"id-0-0", "id-0-1", "id-0-2"}


def test_an_intake_that_cannot_go_back_stops_rather_than_commit_past_the_batch(rig, monkeypatch):
    rig.run_batch([record(0)])
    wheel = rig.intake._wheel
    monkeypatch.setattr(wheel, "append_many", _once(wheel.append_many, RuntimeError("bug")))

    def refuse(_tp: Any) -> None:
        raise KafkaException(KafkaError(KafkaError._STATE, "not fetching"))

    monkeypatch.setattr(rig.consumer, "seek", refuse)
    rig.feed([record(1), record(2)], [record(3)])
    assert rig.intake.join(10), "the intake read on past a batch it could not re-read"
    assert rig.fatal
    assert "could not re-read a failed batch" in rig.fatal[0]
    assert rig.consumer.committed_offsets == {0: 1}
