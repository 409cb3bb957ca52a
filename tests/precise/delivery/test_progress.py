"""Replica progress reports: parsing hostile bytes, and what a report covers."""

from __future__ import annotations

import base64
import json
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayservice.precise.delivery.progress import (
    FAR_FUTURE_MS,
    Progress,
    Report,
    encode_report,
    parse_report,
)
from delayservice.precise.delivery.sent_records import (
    MAX_INFLATED,
    MAX_NAMED,
    decode_sent,
    decode_sent_record,
    encode_sent,
    sent_key,
)
from delayservice.precise.placement import Placement, Role


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


def _progress(
    member: int = 1, members: int = 2, dropped: list[str] | None = None, **state
) -> tuple[Progress, FakeProducer]:
    producer = FakeProducer()
    progress = Progress(
        "done",
        Placement(members, member, 2),
        producer,
        lambda _callbacks: None,  # the reader thread is not started here
        committed=lambda p: state.get("through", {}).get(p),
        origin=lambda p: state.get("origin", {}).get(p),
        earliest_s=lambda: state.get("earliest", {}),
        takeover_ms=3_000,
        roles=state.get("roles", {}),
        dropped=None if dropped is None else dropped.append,
    )
    return progress, producer


def _report(partition: int, member: int, start: int, through: int, due_before: int) -> bytes:
    return encode_report(Report(partition, member, start, through, due_before))


@given(st.binary(max_size=200))
def test_any_bytes_parse_to_a_report_or_to_none(raw):
    report = parse_report(raw)
    assert report is None or isinstance(report, Report)


@pytest.mark.parametrize(
    "raw",
    [None, b"", b"{}", b"[]", b'{"member": "x"}', b"\xff", b'{"partition":0,"member":0,"from":1}'],
)
def test_malformed_reports_are_ignored(raw):
    assert parse_report(raw) is None


def test_a_report_covers_offsets_from_its_data_directory_and_due_before_its_pointer():
    progress, _ = _progress(member=1)
    progress._take(_report(0, 0, 100, 200, 5_000))  # what the reader does
    assert progress.covers(0, 150, 4_999)
    assert not progress.covers(0, 150, 5_000)  # due at or after its earliest open slot
    assert not progress.covers(0, 99, 10)  # before this data directory: lost with the old one
    assert not progress.covers(0, 200, 10)  # not yet committed by the owner
    assert not progress.covers(1, 150, 10)  # another partition


def test_only_the_other_holder_of_a_partition_is_believed():
    progress, _ = _progress(member=1, members=3)  # partition 0: owner 0, replica 1
    progress._take(_report(0, 2, 0, 200, FAR_FUTURE_MS))  # member 2 holds nothing of it
    progress._take(_report(0, 1, 0, 200, FAR_FUTURE_MS))  # its own report, read back
    assert not progress.covers(0, 10, 10)
    progress._take(_report(0, 0, 0, 200, FAR_FUTURE_MS))
    assert progress.covers(0, 10, 10)


@pytest.mark.parametrize(
    ("partition", "member"),
    [(0, 2), (0, -1), (0, 10**9), (-1, 0), (-2, 0), (1 << 14, 0), (10**12, 0)],
)
def test_reports_from_no_such_member_or_for_no_such_partition_change_nothing(partition, member):
    progress, _ = _progress(member=1)
    progress._take(_report(partition, member, 0, 2**62, FAR_FUTURE_MS))  # must not raise
    assert progress._reports == {}
    progress._take(_report(0, 0, 0, 200, FAR_FUTURE_MS))  # the rightful holder still counts
    assert progress.covers(0, 10, 10)


def test_coverage_never_moves_back_and_outlives_a_lost_disk():
    progress, _ = _progress()
    progress._take(_report(0, 0, 0, 300, 9_000))
    progress._take(_report(0, 0, 0, 200, 5_000))
    assert progress.covers(0, 250, 8_000)
    progress._take(_report(0, 0, 300, 310, 9_000))  # a new disk, from the old commit on
    assert progress.covers(0, 250, 8_000)  # the lost disk's reports still vouch for it
    assert progress.covers(0, 305, 8_000)
    assert not progress.covers(0, 315, 8_000)  # not yet committed by the new one


def test_each_holder_reports_what_is_durable_and_settled_only_when_it_moves():
    progress, producer = _progress(
        member=0,
        through={0: 50, 1: 70},
        origin={0: 10, 1: 20},
        earliest={1: 7},
        roles={0: Role.OWNER, 1: Role.REPLICA},
    )
    progress.report()
    assert sorted(k for _, k, _ in producer.sent) == [b"0:0", b"1:0"]
    sent = {r.partition: r for r in (parse_report(v) for _, _, v in producer.sent) if r}
    assert sent[0] == Report(0, 0, 10, 50, FAR_FUTURE_MS)
    # A replica's slots are in fire time, the takeover delay after due.
    assert sent[1] == Report(1, 0, 20, 70, 4_000)
    progress._next_report = 0  # the next second
    progress.report()
    assert len(producer.sent) == 2  # nothing moved, nothing sent


def _sent(member: int, offsets: dict[tuple[int, int], list[int]], writer: int | None = None):
    return encode_sent(member, offsets, writer), sent_key(member, writer)


def test_the_other_holders_delivery_records_cover_until_its_report_claims_them():
    """Exactly-once: what the owner's transactions named delivered covers the replica's
    copies before any report; a report claiming them lets them go."""
    progress, _ = _progress(member=1)
    value, key = _sent(0, {(0, 100): [5, 6, 9]})
    progress._take(value, key)
    assert progress.covers(0, 6, 100_500)
    assert not progress.covers(0, 7, 100_500)
    assert progress.named == 3
    progress._take(_report(0, 0, 0, 7, 101_000))  # claims 5 and 6, not 9
    assert progress.named == 1
    assert progress.covers(0, 9, 100_500)


def test_a_replicas_takeover_records_cover_the_owners_overdue_records():
    """The replica writes under the owner's id with its own slot (fire time, the
    takeover delay after due): the owner counts them covered."""
    progress, _ = _progress(member=0)
    value, key = _sent(0, {(0, 103): [1, 2]}, writer=1)
    assert key == b"sent:0:by:1"
    progress._take(value, key)
    assert progress.covers(0, 1, 100_000)
    progress._take(_report(0, 1, 0, 3, 101_000))  # due before 101 s: fired before 104 s
    assert progress.named == 0


@pytest.mark.parametrize(
    ("member", "writer", "offsets", "dropped"),
    [
        (1, 1, {(0, 100): [5]}, []),  # written by this member itself
        (2, 2, {(0, 100): [5]}, ["not_holder"]),  # by a member that does not hold partition 0
        (0, 7, {(0, 100): [5]}, ["unknown_member"]),  # by no such member
        (0, 0, {(1 << 20, 100): [5]}, ["bad_slot"]),  # for no such partition
    ],
)
def test_delivery_records_of_this_member_strangers_or_no_such_partition_cover_nothing(
    member: int, writer: int, offsets: dict[tuple[int, int], list[int]], dropped: list[str]
):
    counted: list[str] = []
    progress, _ = _progress(member=1, members=3, dropped=counted)
    progress._take(*_sent(member, offsets, writer))
    assert progress.named == 0
    assert not progress.covers(0, 5, 100_000)
    assert counted == dropped


@pytest.mark.parametrize("key", [b"sent:2", b"sent:0:by:2", b"sent:"])
def test_a_delivery_record_under_another_key_than_its_body_names_covers_nothing(key: bytes):
    """The owner's body under a key that is not its own: compaction would keep it in
    place of that key's latest record, so it is not believed (docs/security.md)."""
    counted: list[str] = []
    progress, _ = _progress(member=1, members=3, dropped=counted)
    value, _ = _sent(0, {(0, 100): [5, 6]})
    progress._take(value, key)
    assert progress.named == 0
    assert not progress.covers(0, 5, 100_000)
    assert counted == ["key_mismatch"]


@pytest.mark.parametrize(
    ("report", "reason"),
    [
        (b"not json", "malformed"),
        (_report(0, 7, 0, 200, FAR_FUTURE_MS), "unknown_member"),
        (_report(0, 2, 0, 200, FAR_FUTURE_MS), "not_holder"),
        (_report(1 << 20, 0, 0, 200, FAR_FUTURE_MS), "bad_slot"),
    ],
)
def test_reports_not_taken_are_counted_by_reason(report: bytes, reason: str):
    counted: list[str] = []
    progress, _ = _progress(member=1, members=3, dropped=counted)
    progress._take(report, b"0:0")
    assert counted == [reason]


def test_a_forged_delivery_record_naming_too_many_offsets_is_ignored():
    forged = base64.b64encode(zlib.compress(json.dumps({"0:1": [0, MAX_NAMED + 1]}).encode()))
    value = json.dumps({"v": 1, "member": 0, "sent": forged.decode()}).encode()
    assert decode_sent_record(value) is None
    progress, _ = _progress(member=1)
    progress._take(value, b"sent:0")
    assert progress.named == 0


def _sent_value(inflated: bytes) -> bytes:
    packed = base64.b64encode(zlib.compress(inflated, 9)).decode()
    return json.dumps({"v": 1, "member": 0, "sent": packed}).encode()


def test_a_zlib_bomb_is_refused_at_its_first_step():
    """128 MiB of padding before valid runs, 130 KB on the wire: the padding is no part
    of runs, so the first step of inflating it ends the reading."""
    value = _sent_value(b" " * (128 << 20) + json.dumps({"0:1": [0, 1]}).encode())
    assert len(value) < 200_000
    assert decode_sent_record(value) is None


def test_runs_that_inflate_past_the_bound_are_refused():
    runs = b'{"0:1":[0,1' + b",1,1" * (MAX_INFLATED // 4) + b"]}"
    assert decode_sent_record(_sent_value(runs)) is None


def test_runs_longer_than_one_step_of_inflating_read_whole():
    offsets = {(0, 1): range(0, 1_200_000, 2)}  # 4.8 MB of runs
    assert decode_sent(encode_sent(0, offsets)) == {(0, 1): set(offsets[(0, 1)])}


def test_runs_of_no_offsets_are_malformed():
    """The writer never writes one; a forged record of millions of them would cost a
    loop turn each while naming nothing."""
    for runs in ([0, 0], [0, 1, 5, 0], [0, -1]):
        packed = base64.b64encode(zlib.compress(json.dumps({"0:1": runs}).encode()))
        value = json.dumps({"v": 1, "member": 0, "sent": packed.decode()}).encode()
        assert decode_sent_record(value) is None, runs


@given(st.binary(max_size=200))
def test_any_bytes_under_a_sent_key_cover_nothing_and_never_raise(raw):
    progress, _ = _progress(member=1)
    progress._take(raw, b"sent:0")
    assert not progress.covers(0, 0, 0)
