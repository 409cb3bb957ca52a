"""The audit's reschedule rules on hand-made rows: moved messages are judged by their last move.

The precise topic `dp` (level `exact`), as of T0 + 60 s with a 10 s grace period, as in
test_audit_transform. Each move is the daemon's reply on the outcomes topic, keyed by
where its reschedule marker landed (`dp:partition:offset`).

  r1   due at 5 s, moved to 1 s, delivered at 1.003 s           (not early: 3 ms late)
  r2   due at 1 s, moved to 55 s, not delivered                 (pending, not missing)
  r3   due at 1 s, moved to 3 s, delivered at 3.020 s           (20 ms late, not 2020)
  r4   due at 20 s, moved to 9 s by marker 201 and then to 2 s by marker 205, whose
       reply came first; marker 201 read again after a restart says superseded;
       delivered at 2.001 s                                     (the last marker wins)
  r5   moved to 4 s, one reply from the owner and one from the replica, delivered at
       4 s                                                      (one row, one move)
  r6   due at 1 s, delivered at 1.005 s; every malformed reply names it and a time of
       30 s                                                     (ignored: not early)
  r7   due at 5 s, moved to 2 s, delivered at 5.001 s carrying 5 s  (superseded)
  r8   due at 20 s, moved to 6 s and then to 2.5 s, delivered at 6 s carrying 6 s
                                                                (superseded)
  r9   due at 1 s, delivered at 1.002 s; replies too_late, unmatched, refused and
       cancelled, some naming a time                            (nothing changes)
  r10  due at 1 s, moved to 8 s, a cancel marker at 3 s, delivered at 8.001 s
                                                                (the cancel was in time)
  r11  moved to 2 s, delivered at 2 s, then a copy carrying its old 1 s
                                                                (duplicated, superseded)
  x1   a full envelope that also carries delay-reschedule: a marker, not a message
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from delayservice.audit import load, summary, transform
from delayservice.audit.extract import kafka_schema
from tests.audit.test_audit_transform import (
    AS_OF,
    EPOCH,
    GRACE,
    LEVELS,
    PRECISE,
    T0,
    envelope,
    forwarded,
    frame,
    record,
)

pytestmark = pytest.mark.spark

OUTCOMES = f"{PRECISE}_outcomes"


def exact(mid: str, delay_ms: int, *, partition: int = 0) -> tuple[Any, ...]:
    return record(PRECISE, T0, envelope(mid, "orders", delay_ms), partition=partition)


def reply_value(mid: Any, outcome: str, due_ms: Any, **changes: Any) -> bytes:
    """A reply as `markers.replies` writes it, with `changes` laid over it."""
    fields = {
        "v": 1,
        "kind": "reschedule",
        "id": mid,
        "outcome": outcome,
        "due_ms": due_ms,
        "member": 0,
        "role": "owner",
    }
    return json.dumps({**fields, **changes}, separators=(",", ":")).encode()


class Outcomes:
    """Rows of the outcomes topic in the order the daemon wrote them."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    def raw(self, key: bytes | None, value: bytes | None) -> None:
        stamp = EPOCH + timedelta(milliseconds=T0 + len(self.rows))
        self.rows.append((key, value, OUTCOMES, 0, len(self.rows), stamp, 0, []))

    def reply(
        self, marker: str, mid: str, outcome: str, due_ms: int | None = None, **changes: Any
    ) -> None:
        self.raw(marker.encode(), reply_value(mid, outcome, due_ms, **changes))

    def moved(self, marker: str, mid: str, due_ms: int, **changes: Any) -> None:
        self.reply(marker, mid, "moved", due_ms, **changes)


MALFORMED: list[tuple[str, bytes | None, bytes | None]] = [
    ("not JSON", b"dp:0:150", b"moved to 30 s"),
    ("a JSON array", b"dp:0:151", b'["r6", "moved", 1700000030000]'),
    ("version 2", b"dp:0:152", reply_value("r6", "moved", T0 + 30_000, v=2)),
    ("version as text", b"dp:0:153", reply_value("r6", "moved", T0 + 30_000, v="1")),
    ("a cancel's reply", b"dp:0:154", reply_value("r6", "moved", T0 + 30_000, kind="cancel")),
    ("no id", b"dp:0:155", reply_value(None, "moved", T0 + 30_000)),
    ("an empty id", b"dp:0:156", reply_value("", "moved", T0 + 30_000)),
    ("due as text", b"dp:0:157", reply_value("r6", "moved", str(T0 + 30_000))),
    ("due not whole", b"dp:0:158", reply_value("r6", "moved", T0 + 30_000.5)),
    ("due negative", b"dp:0:159", reply_value("r6", "moved", -1)),
    ("moved without a time", b"dp:0:160", reply_value("r6", "moved", None)),
    ("key not a place", b"dp-0-161", reply_value("r6", "moved", T0 + 30_000)),
    ("key on a level topic", b"dt_1:0:162", reply_value("r6", "moved", T0 + 30_000)),
    ("key partition not a number", b"dp:x:163", reply_value("r6", "moved", T0 + 30_000)),
    ("key offset too big", b"dp:0:99999999999999999999", reply_value("r6", "moved", T0 + 1)),
    ("no key", None, reply_value("r6", "moved", T0 + 30_000)),
    ("no value", b"dp:0:164", None),
]


@pytest.fixture(scope="module")
def story(spark):
    delay = [
        *(exact(m, 5000) for m in ("r1", "r7")),
        *(exact(m, 1000) for m in ("r2", "r3", "r5", "r6", "r9", "r10", "r11")),
        *(exact(m, 20_000, partition=1) for m in ("r4", "r8")),
        record(PRECISE, T0 + 3000, {"delay-v": "1", "delay-cancel": "r10"}),
        record(
            PRECISE, T0, {**envelope("x1", "orders", 1000), "delay-reschedule": "r1"}, partition=0
        ),
    ]
    out = Outcomes()
    out.moved("dp:0:101", "r1", T0 + 1000)
    out.moved("dp:0:102", "r2", T0 + 55_000)
    out.moved("dp:0:103", "r3", T0 + 3000)
    out.moved("dp:1:205", "r4", T0 + 2000)
    out.moved("dp:1:201", "r4", T0 + 9000)
    out.reply("dp:1:201", "r4", "superseded")  # read again after a restart
    out.moved("dp:0:104", "r5", T0 + 4000)
    out.moved("dp:0:104", "r5", T0 + 4000, member=1, role="replica")
    for _, key, value in MALFORMED:
        out.raw(key, value)
    out.moved("dp:0:106", "r7", T0 + 2000)
    out.moved("dp:1:210", "r8", T0 + 6000)
    out.moved("dp:1:211", "r8", T0 + 2500)
    out.reply("dp:0:108", "r9", "too_late")
    out.reply("dp:0:109", "r9", "too_late", T0 + 30_000)  # even one naming a time
    for offset, outcome in ((112, "unmatched"), (113, "refused"), (114, "cancelled")):
        out.reply(f"dp:0:{offset}", "r9", outcome, T0 + 30_000)
    out.moved("dp:0:110", "r10", T0 + 8000)
    out.moved("dp:0:111", "r11", T0 + 2000)
    target = [
        record("orders", T0 + 1003, forwarded("r1", T0 + 1000)),
        record("orders", T0 + 3020, forwarded("r3", T0 + 3000)),
        record("orders", T0 + 2001, forwarded("r4", T0 + 2000)),
        record("orders", T0 + 4000, forwarded("r5", T0 + 4000)),
        record("orders", T0 + 1005, forwarded("r6", T0 + 1000)),
        record("orders", T0 + 5001, forwarded("r7", T0 + 5000)),
        record("orders", T0 + 6000, forwarded("r8", T0 + 6000)),
        record("orders", T0 + 1002, forwarded("r9", T0 + 1000)),
        record("orders", T0 + 8001, forwarded("r10", T0 + 8000)),
        record("orders", T0 + 2000, forwarded("r11", T0 + 2000)),
        record("orders", T0 + 2100, forwarded("r11", T0 + 1000)),
    ]
    outcomes = spark.createDataFrame(out.rows, kafka_schema())
    return frame(spark, delay), frame(spark, target), outcomes


@pytest.fixture(scope="module")
def moved(story):
    _, _, outcomes = story
    return {r["id"]: r for r in transform.moves(outcomes, [PRECISE]).collect()}


@pytest.fixture(scope="module")
def messages(story):
    delay, target, outcomes = story
    return transform.reconcile(
        transform.accepted(delay, LEVELS, precise_topics=[PRECISE]),
        transform.cancels(delay, [PRECISE]),
        transform.deliveries(target),
        transform.moves(outcomes, [PRECISE]),
        as_of_ms=AS_OF,
        grace_ms=GRACE,
    ).cache()


@pytest.fixture(scope="module")
def by_id(messages):
    rows = messages.collect()
    assert len(rows) == len({r["id"] for r in rows}), "one row per message"
    return {r["id"]: r for r in rows}


def test_each_move_is_the_last_moved_marker_of_its_id(moved):
    assert {m: (r["moved_due_ms"], r["moved_by"]) for m, r in moved.items()} == {
        "r1": (T0 + 1000, "dp:0:101"),
        "r2": (T0 + 55_000, "dp:0:102"),
        "r3": (T0 + 3000, "dp:0:103"),
        "r4": (T0 + 2000, "dp:1:205"),  # the higher marker offset, whose reply came first
        "r5": (T0 + 4000, "dp:0:104"),
        "r7": (T0 + 2000, "dp:0:106"),
        "r8": (T0 + 2500, "dp:1:211"),
        "r10": (T0 + 8000, "dp:0:110"),
        "r11": (T0 + 2000, "dp:0:111"),
    }


@pytest.mark.parametrize(("why", "key", "value"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_reply_moves_nothing(spark, why, key, value):
    out = Outcomes()
    out.moved("dp:0:1", "control", T0 + 1)
    out.raw(key, value)
    rows = transform.moves(spark.createDataFrame(out.rows, kafka_schema()), [PRECISE]).collect()
    assert [r["id"] for r in rows] == ["control"], why


def test_a_message_moved_earlier_is_due_at_its_new_time(by_id):
    r1 = by_id["r1"]
    assert (r1["original_due_ms"], r1["due_ms"], r1["moved_by"]) == (
        T0 + 5000,
        T0 + 1000,
        "dp:0:101",
    )
    assert (r1["status"], r1["early"], r1["lateness_ms"], r1["superseded"]) == (
        "delivered",
        False,
        3,
        False,
    )


def test_a_message_moved_later_is_judged_by_its_new_time(by_id):
    r2, r3 = by_id["r2"], by_id["r3"]
    # Its old due time plus the grace period passed before as_of; the new one did not.
    assert r2["original_due_ms"] + GRACE < AS_OF < r2["due_ms"] + GRACE
    assert (r2["status"], r2["missing"], r2["pending"]) == ("pending", False, True)
    assert (r3["due_ms"], r3["lateness_ms"], r3["early"]) == (T0 + 3000, 20, False)


def test_the_last_marker_wins_and_replies_count_once(by_id):
    r4, r5 = by_id["r4"], by_id["r5"]
    assert (r4["due_ms"], r4["early"], r4["lateness_ms"], r4["superseded"]) == (
        T0 + 2000,
        False,
        1,
        False,
    )
    assert (r5["due_ms"], r5["deliveries"], r5["lateness_ms"]) == (T0 + 4000, 1, 0)


def test_malformed_and_unapplied_replies_change_nothing(by_id):
    for mid in ("r6", "r9"):
        row = by_id[mid]
        assert (row["due_ms"], row["original_due_ms"], row["moved_due_ms"]) == (
            T0 + 1000,
            T0 + 1000,
            None,
        ), mid
        assert (row["early"], row["superseded"]) == (False, False), mid
    assert "x1" not in by_id  # a record that carries delay-reschedule is a marker


def test_a_copy_sent_at_a_replaced_time_is_superseded(by_id):
    r7, r8, r11 = by_id["r7"], by_id["r8"], by_id["r11"]
    assert (r7["superseded"], r7["superseded_copies"], r7["early"], r7["lateness_ms"]) == (
        True,
        1,
        False,
        3001,
    )
    assert (r8["due_ms"], r8["superseded"], r8["lateness_ms"]) == (T0 + 2500, True, 3500)
    # The first copy was right; a later one carrying the old time is still a broken promise.
    assert (r11["deliveries"], r11["superseded_copies"], r11["lateness_ms"]) == (2, 1, 0)
    assert (r11["duplicated"], r11["superseded"]) == (True, True)


def test_a_cancel_is_in_time_against_the_moved_due_time(by_id):
    r10 = by_id["r10"]
    assert r10["original_due_ms"] < r10["cancel_ms"] < r10["due_ms"]
    assert (r10["delivered"], r10["cancelled"], r10["early"]) == (True, True, False)


def test_superseded_is_counted_shown_and_fails_the_audit(messages, tmp_path):
    rows = summary.collect_summary(summary.summarize(messages))
    total = next(r for r in rows if r.scope == "total")
    assert total.counts == {
        "accepted": 11,
        "delivered": 10,
        "missing": 0,
        "duplicated": 1,
        "early": 0,
        "superseded": 3,
        "cancelled": 1,
        "pending": 1,
        "leaked": 0,
    }
    assert not summary.promises_kept(total.counts)
    assert summary.promises_kept(total.counts | {"superseded": 0, "duplicated": 7})
    assert transform.moved_count(messages) == 9
    table = load.console_table(rows).splitlines()
    assert table[0].split()[5] == "SUPERSEDED"
    assert table[-1].split()[:7] == ["total", "11", "10", "0", "1", "0", "3"]
    plot = load.plot_lateness(summary.lateness_histogram(messages), rows, tmp_path)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
