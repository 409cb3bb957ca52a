"""What a pass of the level markers reader keeps, forgets and reports (issue 46, 47):

- a pass that runs out of time keeps its ends, so a backlog of markers growing faster
  than one pass reads still ends with the gate moving, where each pass used to start
  over against further ends and the gate stayed shut;
- an answer stamped in the future (a forger's, a clock ahead) is forgotten with the
  window like any other, not kept for ever;
- readiness turns red, with the reason, while the gate stands still.
"""

from __future__ import annotations

import json

import pytest

from delayservice.level import marker_reader
from delayservice.markers.replies import reply_key
from tests.level.fakes import message
from tests.level.marker_reading import Reading, cancel_on, reading_rig

DAY_MS = 86_400_000


class _Stepping:
    """The reader's `time`: each look at the monotonic clock finds a second gone, so a
    pass's deadline comes after a batch or two, however fast the fakes answer."""

    def __init__(self) -> None:
        self._now = 0.0

    def monotonic(self) -> float:
        self._now += 1.0
        return self._now


@pytest.fixture
def reading(monkeypatch: pytest.MonkeyPatch) -> Reading:
    return reading_rig(monkeypatch)


def test_a_backlog_growing_faster_than_a_pass_reads_still_lets_the_gate_move(
    reading: Reading, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(marker_reader, "BATCH", 10)
    monkeypatch.setattr(marker_reader, "PASS_TIMEOUT_S", 1.5)
    monkeypatch.setattr(marker_reader, "time", _Stepping())  # a pass reads a batch or two
    for _ in range(50):
        cancel_on(reading, 0)
    first = reading.gate.through_ms
    behind = reading.clock.ms()  # the gate must get at least this far
    for _ in range(12):
        reading.one_pass()
        for _ in range(30):  # more arrive than a pass reads
            cancel_on(reading, 0)
    assert reading.gate.through_ms > first, "no pass ever reached its ends: the gate stayed shut"
    assert reading.gate.through_ms >= behind


def test_an_answer_stamped_in_the_future_is_forgotten_with_the_window(reading: Reading) -> None:
    outcomes = (reading.outcomes, 0)
    key = reply_key(reading.markers, 0, 12345)  # a marker this reader never read
    reply = {"v": 1, "kind": "cancel", "id": "x-l1p0", "outcome": "cancelled"}
    future = reading.clock.ms() + 365 * DAY_MS
    reading.fake.append(
        outcomes,
        message(0, 0, future, topic=reading.outcomes, key=key, value=json.dumps(reply).encode()),
    )
    reading.one_pass()
    assert reading.book.is_answered(key)
    reading.clock.advance(3 * reading.reader._window_ms / 1000)  # past the window
    reading.one_pass()
    assert not reading.book.is_answered(key), "an answer stamped a year ahead is kept for a year"


def test_readiness_says_so_while_the_gate_stands_still(reading: Reading) -> None:
    reader = reading.reader
    reader._thread.start = lambda: None  # type: ignore[method-assign]
    reader._thread.is_alive = lambda: True  # type: ignore[method-assign]
    assert reader.health(5.0) == (True, "markers: read")
    reading.fake.paused_tps.add((reading.markers, 0))
    cancel_on(reading, 0)  # cannot be fetched: no pass reaches its end
    reader._advanced_at -= 6.0
    reading.one_pass()
    ready, why = reader.health(5.0)
    assert not ready
    assert "not read through for 6s" in why
    reading.fake.paused_tps.clear()
    reading.one_pass()
    assert reader.health(5.0) == (True, "markers: read")
