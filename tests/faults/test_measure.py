"""The verdict itself, on hand-made records: if it could not see a lost, early,
duplicated or misrouted record, every scenario above would pass vacuously."""

from __future__ import annotations

from typing import Any

import pytest

from tests.faults.harness import Produced, Rec
from tests.faults.measure import Topology, evaluate, expect, recovery_s

LEVEL = "lv-1"
DLQ = "dlq"
TARGET = "target"
TOPOLOGY = Topology({LEVEL: 1000, "lv-2": 2000}, DLQ, {TARGET: 3}, 3)


def _rec(topic: str, offset: int, ts: int, headers: list[tuple[str, Any]], **kw: Any) -> Rec:
    return Rec(
        topic,
        kw.get("partition", 0),
        offset,
        2,
        ts,
        kw.get("key", b"k"),
        kw.get("value", b"v"),
        tuple(headers),
    )


def _envelope(message_id: str, delay_ms: str = "500", **extra: bytes) -> list[tuple[str, Any]]:
    return [
        ("delay-v", b"1"),
        ("delay-target", TARGET.encode()),
        ("delay-ms", delay_ms.encode()),
        ("delay-id", message_id.encode()),
        *extra.items(),
    ]


def _forwarded(message_id: str, ts: int, due: int, offset: int = 0) -> Rec:
    return _rec(
        TARGET, offset, ts, [("delay-id", message_id.encode()), ("delay-due-ms", b"%d" % due)]
    )


class _Reader:
    def __init__(self, *records: Rec) -> None:
        self.records: dict[str, list[Rec]] = {}
        for rec in records:
            self.records.setdefault(rec.topic, []).append(rec)


def _sent(*records: Rec) -> dict[tuple[str, int, int], Produced]:
    return {
        (r.topic, r.partition, r.offset): Produced(r.topic, r.partition, r.offset, True)
        for r in records
    }


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("delay-v", b" 1"),
        ("delay-v", b"01"),
        ("delay-v", None),
        ("delay-ms", "\uff11\uff12".encode()),
        ("delay-ms", b"1_000"),
        ("delay-ms", b"-5"),
        ("delay-ms", str(2**63).encode()),
        ("delay-target", b"missing"),
        ("delay-target", b"\xff"),
        ("delay-partition", b"3"),
    ],
)
def test_malformed_envelopes_must_be_dead_lettered(name: str, value: bytes | None) -> None:
    headers = [(n, value if n == name else v) for n, v in _envelope("a")]
    if name == "delay-partition":
        headers.append((name, value))
    assert expect(_rec(LEVEL, 0, 0, headers), TOPOLOGY).kind == "dead"


def test_a_duplicated_envelope_header_is_malformed_and_a_valid_one_is_forwarded() -> None:
    valid = _envelope("a")
    assert expect(_rec(LEVEL, 0, 0, valid), TOPOLOGY).kind == "forward"
    twice = [*valid, ("delay-ms", b"500")]
    assert expect(_rec(LEVEL, 0, 0, twice), TOPOLOGY).kind == "dead"


def test_the_verdict_sees_lost_early_duplicated_and_misrouted_records() -> None:
    on_time = _rec(LEVEL, 0, 10_000, _envelope("on-time"))
    early = _rec(LEVEL, 1, 10_000, _envelope("early", delay_ms="1500"))  # held to 1.5 s
    lost = _rec(LEVEL, 2, 10_000, _envelope("lost"))
    twice = _rec(LEVEL, 3, 10_000, _envelope("twice"))
    bad = _rec(LEVEL, 4, 10_000, [("delay-v", b"2"), ("delay-id", b"bad")])
    sources = (on_time, early, lost, twice, bad)
    reader = _Reader(
        *sources,
        _forwarded("on-time", 11_000, 11_000, 0),
        _forwarded("early", 11_200, 11_500, 1),
        _forwarded("twice", 11_100, 11_000, 2),
        _forwarded("twice", 12_000, 11_000, 3),
        _forwarded("bad", 20_000, 0, 4),
    )
    report = evaluate("unit", reader, TOPOLOGY, _sent(*sources))
    assert [lost.split()[0] for lost in report.lost] == [f"{LEVEL}[0]@2"]
    assert [early.split(" reached ")[1] for early in report.early] == ["target 300 ms before due"]
    assert report.duplicates == 1
    assert any("forwarded to target" in w for w in report.wrong)
    assert sorted(report.lateness_s) == [-0.3, 0.0, 0.1]
    assert recovery_s(report, [11_050]) == [0.05]


def _letter(offset: int, origin_offset: int, value: bytes) -> Rec:
    """A dead letter on the dead-letter topic of the level record at `origin_offset`."""
    return _rec(
        DLQ,
        offset,
        10_001 + offset,
        [
            ("delay-v", b"x"),
            ("dlq-reason", b"invalid_envelope"),
            ("dlq-origin-topic", LEVEL.encode()),
            ("dlq-origin-partition", b"0"),
            ("dlq-origin-offset", str(origin_offset).encode()),
        ],
        value=value,
    )


def test_dead_letters_are_matched_by_origin_and_must_carry_the_original() -> None:
    source = _rec(LEVEL, 7, 10_000, [("delay-v", b"x")], value=b"original")
    report = evaluate("unit", _Reader(source, _letter(0, 7, b"altered")), TOPOLOGY, _sent(source))
    assert not report.lost
    assert report.dead_lettered == 1
    assert report.dead_letters_repeated == 0
    assert report.wrong == [f"{LEVEL}[0]@7 (delay-v is b'x'): dead letter's key or value differs"]


def test_a_record_dead_lettered_twice_is_a_duplicate_and_named_so() -> None:
    once = _rec(LEVEL, 7, 10_000, [("delay-v", b"x")], value=b"once")
    twice = _rec(LEVEL, 8, 10_000, [("delay-v", b"x")], value=b"twice")
    letters = [_letter(0, 7, b"once"), _letter(1, 8, b"twice"), _letter(2, 8, b"twice")]
    report = evaluate("unit", _Reader(once, twice, *letters), TOPOLOGY, _sent(once, twice))
    assert (report.dead_lettered, report.dead_letters_repeated) == (2, 1)
    assert report.duplicates == 1
    assert "1 of the duplicates are dead letters" in report.row()["notes"]


@pytest.mark.parametrize(("size", "accepted"), [(100, False), (600 * 1024, True)])
def test_a_payload_free_stub_is_accepted_only_for_a_record_too_large_to_copy(
    size: int, accepted: bool
) -> None:
    source = _rec(LEVEL, 3, 10_000, [("delay-v", b"x")], value=b"v" * size)
    stub = _rec(
        DLQ,
        0,
        10_001,
        [
            ("dlq-reason", b"too_large"),
            ("dlq-stub", b"1"),
            ("dlq-origin-topic", LEVEL.encode()),
            ("dlq-origin-partition", b"0"),
            ("dlq-origin-offset", b"3"),
        ],
        value=None,
    )
    report = evaluate("unit", _Reader(source, stub), TOPOLOGY, _sent(source))
    assert report.stubs == 1
    assert (not report.wrong) is accepted


def test_a_level_cancel_within_the_lead_raced_and_one_before_it_must_hold() -> None:
    """`cancel_lead`: a level cancel appended at least the lead before the due time must
    hold (delivered anyway is a leak); one within the lead raced the forward, and
    either outcome stands, but never twice."""
    topology = Topology({LEVEL: 1000}, DLQ, {TARGET: 3}, 3, markers="mk", cancel_lead_ms=500)
    held = _rec(LEVEL, 0, 10_000, _envelope("held"))
    raced = _rec(LEVEL, 1, 10_000, _envelope("raced"))
    twice = _rec(LEVEL, 2, 10_000, _envelope("twice"))
    sources = (held, raced, twice)
    reader = _Reader(
        *sources,
        _rec("mk", 0, 10_400, [("delay-v", b"1"), ("delay-cancel", b"held")]),  # 600 ms ahead
        _rec("mk", 1, 10_700, [("delay-v", b"1"), ("delay-cancel", b"raced")]),  # 300 ms
        _rec("mk", 2, 10_700, [("delay-v", b"1"), ("delay-cancel", b"twice")]),
        _forwarded("held", 11_000, 11_000, 0),
        _forwarded("raced", 11_000, 11_000, 1),
        _forwarded("twice", 11_000, 11_000, 2),
        _forwarded("twice", 11_100, 11_000, 3),
    )
    report = evaluate("unit", reader, topology, _sent(*sources))
    assert [leak.split(" (")[-1] for leak in report.cancels_leaked] == ["held)"]
    assert sorted(s.expect.id for s in report.raced) == ["raced", "twice"]
    assert report.lost == []
    assert report.duplicates == 1
    strict = Topology({LEVEL: 1000}, DLQ, {TARGET: 3}, 3, markers="mk")
    assert len(evaluate("unit", reader, strict, _sent(*sources)).cancels_leaked) == 3


def test_a_move_to_the_millisecond_it_replaced_is_not_a_superseded_delivery() -> None:
    """A level message due at 11,000 moved by a marker to 11,000 exactly (a CI run of
    row 31 drew one), and delivered for it: on time, not at a replaced time. One
    marker read twice acts once. A delivery for the time the move replaced, when the
    move asked for another, stays superseded."""
    topology = Topology({LEVEL: 1000}, DLQ, {TARGET: 3}, 3, markers="mk")
    same = _rec(LEVEL, 0, 10_000, _envelope("same"))
    other = _rec(LEVEL, 1, 10_000, _envelope("other"))
    move_same = [("delay-v", b"1"), ("delay-reschedule", b"same"), ("delay-due-ms", b"11000")]
    move_other = [("delay-v", b"1"), ("delay-reschedule", b"other"), ("delay-due-ms", b"12000")]
    reader = _Reader(
        same,
        other,
        _rec("mk", 0, 10_200, move_same),
        _rec("mk", 0, 10_200, move_same),  # the same record, read again
        _rec("mk", 1, 10_200, move_other),
        _forwarded("same", 11_000, 11_000, 0),
        _forwarded("other", 11_000, 11_000, 1),
    )
    report = evaluate("unit", reader, topology, _sent(same, other))
    assert len(report.superseded) == 1
    assert "(other) delivered for 11000, moved to 12000" in report.superseded[0]
    moved = {s.expect.id: s for s in report.moved}
    assert moved["same"].due_ms == 11_000
    assert moved["same"].replaced == (11_000,), "the marker read twice acted twice"
