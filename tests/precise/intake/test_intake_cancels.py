"""Where the intake keeps a cancel: only on the partition its id names (`markers.precise_ids`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from delayservice.markers.precise_ids import precise_id
from tests.precise.intake_rig import Rig, record, running, wait


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with running(tmp_path, partitions=2) as made:
        yield made


def _cancels(rig: Rig, outcome: str) -> float:
    return rig.metrics.precise_cancels.labels(outcome)._value.get()


def test_a_cancel_on_the_partition_its_id_names_is_kept_and_stops_the_message(rig):
    mid, partition = precise_id(2)
    rig.run_batch([record(0, partition=partition, cancel=mid)])
    assert mid in rig.cancels
    rig.run_batch([record(1, partition=partition, message_id=mid)])
    assert wait(lambda: _cancels(rig, "cancelled") == 1)
    assert rig.store.disk_bytes() == 0, "the cancelled message was written all the same"


def test_a_cancel_on_another_partition_is_not_kept_for_max_delay(rig):
    mid, partition = precise_id(2)
    elsewhere = 1 - partition
    rig.run_batch([record(0, partition=elsewhere, cancel=mid)])
    assert mid not in rig.cancels
    assert _cancels(rig, "unmatched") == 1
    assert rig.consumer.committed_offsets[elsewhere] == 1  # read, counted, done


def test_an_id_that_names_no_partition_is_kept_wherever_it_lands(rig):
    rig.run_batch([record(0, partition=1, cancel="legacy-id")])
    assert "legacy-id" in rig.cancels
