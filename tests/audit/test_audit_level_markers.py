"""The audit's rules for level messages' cancels and moves, on hand-made rows.

Levels dt_1..dt_3 (1 s, 2 s, 3 s), the level markers topic `dm` and its outcomes topic,
as of T0 + 60 s with a 10 s grace period, as in test_audit_transform.

  l1  2 s level, cancelled at 0.5 s, never delivered          (cancelled, not missing)
  l2  2 s level, cancelled at 0.5 s, delivered at 2 s          (leaked: a broken promise)
  l3  2 s level, cancelled at 2.5 s (too late), delivered       (delivered)
  l4  3 s level, moved to 1.5 s; its copy waits on the 2 s level from 0.15 s and is
      delivered at 2.15 s carrying 2.15 s                       (not early, not superseded)
  l5  1 s level, moved to 5 s, but the original went out at 1 s  (early and superseded)
"""

from __future__ import annotations

import pytest

from delayservice.audit import summary, transform
from tests.audit.test_audit_reschedules import Outcomes
from tests.audit.test_audit_transform import (
    AS_OF,
    GRACE,
    LEVELS,
    T0,
    envelope,
    forwarded,
    frame,
    record,
)

pytestmark = pytest.mark.spark

MARKERS = "dm"


@pytest.fixture(scope="module")
def by_id(spark):
    copy = {**envelope("l4", "orders", 1350), "delay-due-ms": str(T0 + 1500)}
    delay = [
        record("dt_2", T0, envelope("l1", "orders", 2000)),
        record("dt_2", T0, envelope("l2", "orders", 2000)),
        record("dt_2", T0, envelope("l3", "orders", 2000)),
        record("dt_3", T0, envelope("l4", "orders", 3000)),
        record("dt_1", T0, envelope("l5", "orders", 1000)),
        record(MARKERS, T0 + 500, {"delay-v": "1", "delay-cancel": "l1"}),
        record(MARKERS, T0 + 500, {"delay-v": "1", "delay-cancel": "l2"}),
        record(MARKERS, T0 + 2500, {"delay-v": "1", "delay-cancel": "l3"}),
        record("dt_2", T0 + 150, {**copy, "delay-moved-by": f"{T0 + 100}:0:3"}),
    ]
    out = Outcomes()
    out.moved(f"{MARKERS}:0:3", "l4", T0 + 1500, member=None, role=None, copy="dt_2:0")
    out.moved(f"{MARKERS}:0:4", "l5", T0 + 5000, member=None, role=None, copy="dt_3:0")
    target = [
        record("orders", T0 + 2001, forwarded("l2", T0 + 2000)),
        record("orders", T0 + 2003, forwarded("l3", T0 + 2000)),
        record("orders", T0 + 2151, forwarded("l4", T0 + 2150)),
        record("orders", T0 + 1001, forwarded("l5", T0 + 1000)),
    ]
    delay_frame = frame(spark, delay)
    outcomes = spark.createDataFrame(out.rows, frame(spark, []).schema)
    rows = transform.reconcile(
        transform.accepted(delay_frame, LEVELS),
        transform.cancels(delay_frame, []),
        transform.deliveries(frame(spark, target)),
        transform.moves(outcomes, [MARKERS]),
        as_of_ms=AS_OF,
        grace_ms=GRACE,
    ).collect()
    return {r["id"]: r for r in rows}


def test_a_level_cancel_in_time_counts_as_cancelled_and_its_delivery_as_broken(by_id):
    l1, l2, l3 = by_id["l1"], by_id["l2"], by_id["l3"]
    assert (l1["status"], l1["cancelled"], l1["missing"], l1["leaked"]) == (
        "cancelled",
        True,
        False,
        False,
    )
    assert (l2["status"], l2["cancelled"], l2["leaked"]) == ("delivered", True, True)
    assert (l3["status"], l3["cancelled"], l3["leaked"]) == ("delivered", False, False)
    assert summary.promises_kept({**dict.fromkeys(summary.COUNTS, 0), "leaked": 1}) is False


def test_a_moved_level_message_is_judged_by_the_time_asked_and_its_copy_by_its_level(by_id):
    l4, l5 = by_id["l4"], by_id["l5"]
    assert (l4["due_ms"], l4["original_due_ms"], l4["moved_by"]) == (
        T0 + 1500,
        T0 + 3000,
        f"{MARKERS}:0:3",
    )
    assert (l4["status"], l4["early"], l4["superseded"], l4["lateness_ms"]) == (
        "delivered",
        False,
        False,
        651,
    )
    assert (l5["early"], l5["superseded"]) == (True, True)
