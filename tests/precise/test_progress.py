"""Replica progress reports: parsing hostile bytes, and what a report covers."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayservice.precise.placement import Placement, Role
from delayservice.precise.progress import FAR_FUTURE_MS, Progress, Report, parse_report


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None]] = []

    def produce(self, topic, value=None, key=None, **_kwargs) -> None:
        self.sent.append((topic, key, value))

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0

    def list_topics(self, topic=None, timeout=0):
        raise NotImplementedError


def _progress(member: int = 1, **state) -> tuple[Progress, FakeProducer]:
    producer = FakeProducer()
    progress = Progress(
        "done",
        Placement(2, member, 2),
        producer,
        lambda _callbacks: None,  # the reader thread is not started here
        committed=lambda p: state.get("through", {}).get(p),
        origin=lambda p: state.get("origin", {}).get(p),
        earliest_unsettled_ms=lambda: state.get("earliest", {}),
    )
    return progress, producer


def _report(member: int, start: int, through: int, due_before: int) -> bytes:
    return json.dumps(
        {"member": member, "from": start, "through": through, "due_before": due_before}
    ).encode()


@given(st.binary(max_size=200))
def test_any_bytes_parse_to_a_report_or_to_none(raw):
    report = parse_report(raw)
    assert report is None or isinstance(report, Report)


@pytest.mark.parametrize(
    "raw", [None, b"", b"{}", b"[]", b'{"member": "x"}', b"\xff", b'{"member":0,"from":1}']
)
def test_malformed_reports_are_ignored(raw):
    assert parse_report(raw) is None


def test_a_report_covers_offsets_from_its_data_directory_and_due_before_its_pointer():
    progress, _ = _progress()
    progress._take(b"0", _report(0, 100, 200, 5_000))  # what the reader does
    assert progress.covers(0, 150, 4_999)
    assert not progress.covers(0, 150, 5_000)  # due at or after its earliest open slot
    assert not progress.covers(0, 99, 10)  # before this data directory: lost with the old one
    assert not progress.covers(0, 200, 10)  # not yet committed by the owner
    assert not progress.covers(1, 150, 10)  # another partition


def test_reports_from_a_member_that_does_not_own_the_partition_are_ignored():
    progress, _ = _progress()
    progress._take(b"0", _report(1, 0, 200, FAR_FUTURE_MS))
    progress._take(b"x", _report(0, 0, 200, FAR_FUTURE_MS))
    assert not progress.covers(0, 10, 10)


def test_an_older_report_of_the_same_disk_does_not_move_coverage_back():
    progress, _ = _progress()
    progress._take(b"0", _report(0, 0, 300, 9_000))
    progress._take(b"0", _report(0, 0, 200, 5_000))
    assert progress.covers(0, 250, 8_000)
    progress._take(b"0", _report(0, 280, 290, 9_000))  # a new disk
    assert not progress.covers(0, 250, 8_000)


def test_the_owner_reports_what_is_durable_and_settled_only_when_it_moves():
    progress, producer = _progress(member=0, through={0: 50}, origin={0: 10}, earliest={1: 7_000})
    progress.roles = {0: Role.OWNER, 1: Role.REPLICA}
    progress.report()
    assert [(t, k) for t, k, _ in producer.sent] == [("done", b"0")]
    sent = parse_report(producer.sent[0][2])
    assert sent == Report(0, 10, 50, FAR_FUTURE_MS)
    progress._next_report = 0  # the next second
    progress.report()
    assert len(producer.sent) == 1  # nothing moved, nothing sent
