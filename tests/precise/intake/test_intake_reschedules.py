"""Reschedule markers through the intake: read, applied after the batch's writes (so a
message and its reschedule may share a batch), counted by outcome, and never a reason
to stop reading."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayservice.envelope import H_DELAY_MS, H_DUE_MS, H_RESCHEDULE
from delayservice.markers.precise_ids import precise_id
from delayservice.markers.requests import BadMarkerError, reschedule_request
from tests.precise.intake_rig import NOW_MS, Rig, record, reschedule, running, wait


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with running(tmp_path, partitions=2) as made:
        yield made


def _outcome(rig: Rig, outcome: str) -> float:
    return rig.metrics.precise_reschedules.labels(outcome)._value.get()


def test_a_message_and_its_reschedule_in_one_batch_move_it_into_memory(rig):
    mid, partition = precise_id(2)
    rig.run_batch(
        [
            record(0, partition=partition, message_id=mid),  # due in an hour: on disk
            reschedule(1, mid, delay_ms=1000, partition=partition),
        ]
    )
    assert wait(lambda: _outcome(rig, "moved") == 1)
    move = rig.reschedules.current(mid)
    assert move is not None
    assert (move.version, move.due_ms) == (1, NOW_MS + 1000)
    assert wait(lambda: len(rig.wheel.buffer) == 1)  # the copy's slot is in memory
    assert rig.consumer.committed_offsets[partition] == 2
    assert rig.replies() == [(1, mid, "moved", NOW_MS + 1000)]
    assert not rig.fatal


def test_an_absolute_time_and_a_time_past_mean_that_time_or_at_once(rig):
    first, partition = precise_id(2)
    second = first.replace(first[:4], "ffff", 1)
    rig.run_batch(
        [
            record(0, partition=partition, message_id=first),
            record(1, partition=partition, message_id=second),
            reschedule(2, first, due_ms=NOW_MS + 90_000, partition=partition),
            reschedule(3, second, due_ms=NOW_MS - 60_000, partition=partition),
        ]
    )
    assert wait(lambda: _outcome(rig, "moved") == 2)
    assert rig.reschedules.current(first).due_ms == NOW_MS + 90_000  # type: ignore[union-attr]
    assert rig.reschedules.current(second).due_ms == NOW_MS  # type: ignore[union-attr]


def test_markers_that_cannot_apply_are_counted_and_read_past(rig):
    mid, partition = precise_id(2)
    rig.run_batch(
        [
            record(0, partition=partition, message_id=mid),
            reschedule(1, mid, delay_ms=1000, partition=1 - partition),  # not where it is
            reschedule(2, "nobody", delay_ms=1000, partition=partition),
            reschedule(3, mid, delay_ms=86_400_001, partition=partition),  # beyond max_delay
            reschedule(4, mid, partition=partition),  # no time
            reschedule(5, "", delay_ms=5, partition=partition),  # no id
        ]
    )
    assert wait(lambda: _outcome(rig, "unmatched") == 2)
    assert _outcome(rig, "refused") == 3
    assert _outcome(rig, "moved") == 0
    assert rig.consumer.committed_offsets[partition] == 6
    assert wait(lambda: len(rig.answered) == 5)
    assert sorted(rig.replies()) == [
        (1, mid, "unmatched", None),
        (2, "nobody", "unmatched", None),
        (3, mid, "refused", None),
        (4, mid, "refused", None),
        (5, "", "refused", None),
    ]
    assert mid not in rig.reschedules
    assert rig.intake.is_alive()
    assert not rig.fatal


def test_a_cancelled_message_is_not_moved(rig):
    mid, partition = precise_id(2)
    rig.run_batch(
        [
            record(0, partition=partition, message_id=mid),
            record(1, partition=partition, cancel=mid),
            reschedule(2, mid, delay_ms=1000, partition=partition),
        ]
    )
    assert wait(lambda: _outcome(rig, "cancelled") == 1)
    assert mid not in rig.reschedules
    assert len(rig.wheel.buffer) == 0
    assert rig.replies() == [(1, mid, "accepted", None), (2, mid, "cancelled", None)]


_VALUES = st.one_of(st.none(), st.binary(max_size=24), st.text(max_size=24))
_NAMES = st.sampled_from([H_RESCHEDULE, H_DELAY_MS, H_DUE_MS, "other", "delay-v"])


@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=8))
def test_any_headers_read_as_a_request_or_not_one_or_a_bad_marker(headers):
    try:
        request = reschedule_request(headers)
    except BadMarkerError:
        return
    if request is None:
        assert H_RESCHEDULE not in [name for name, _ in headers]
        return
    message_id, delay_ms, due_ms = request
    assert message_id
    assert delay_ms is not None or due_ms is not None
    assert all(n is None or 0 <= n < 10**19 for n in (delay_ms, due_ms))


def test_a_bad_marker_next_to_a_good_one_stops_nothing(tmp_path):
    with running(tmp_path) as rig:
        mid = "legacy-id"
        rig.run_batch(
            [
                record(0, message_id=mid),
                reschedule(1, mid, due_ms=-5),
                reschedule(2, mid, delay_ms=2000),
            ]
        )
        assert wait(lambda: _outcome(rig, "moved") == 1)
        assert _outcome(rig, "refused") == 1
        assert rig.intake.is_alive()


def test_a_marker_read_again_after_a_restart_is_answered_again(tmp_path):
    """The first reply may have been lost with the process: the marker read again gets
    the same answer, and moves nothing twice."""
    mid = "legacy-id"
    with running(tmp_path) as rig:
        rig.run_batch([record(0, message_id=mid), reschedule(1, mid, delay_ms=5000)])
        assert wait(lambda: len(rig.answered) == 1)
        rig.store.close()
        rig.cancels.close()
        rig.reschedules.close()
    with running(tmp_path) as again:
        again.run_batch([reschedule(1, mid, delay_ms=5000)])
        again.run_batch([reschedule(2, mid, delay_ms=9000)])
        again.run_batch([reschedule(1, mid, delay_ms=5000)])
        assert wait(lambda: len(again.answered) == 3)
        assert again.replies() == [
            (1, mid, "moved", NOW_MS + 5000),
            (2, mid, "moved", NOW_MS + 9000),
            (1, mid, "superseded", None),  # moved, then moved again by marker 2
        ]
        assert _outcome(again, "moved") == 1


def test_a_reply_the_broker_did_not_take_reads_the_markers_again(tmp_path):
    """The marker's offset commits only once its reply is acknowledged, so no applied
    move goes unanswered: the batch is read again and the move answered again."""
    from delayservice.markers.replies import MarkerRepliesError

    with running(tmp_path) as rig:
        rig.answer_fails = MarkerRepliesError("replies on outcomes not written: timed out")
        rig.run_batch([record(0, message_id="legacy-id"), reschedule(1, "legacy-id", delay_ms=5)])
        assert rig.consumer.seeks == [(0, 0)]
        assert rig.replies() == [(1, "legacy-id", "moved", NOW_MS + 5)]
        assert rig.consumer.committed_offsets == {0: 2}
        assert _outcome(rig, "moved") == 1  # moved once, answered after the second reading
