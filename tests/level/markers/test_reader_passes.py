"""What a pass of the level markers reader keeps, forgets and reports (issue 46, 47):

- a pass that runs out of time keeps its ends, so a backlog of markers growing faster
  than one pass reads still ends with the gate moving, where each pass used to start
  over against further ends and the gate stayed shut;
- behind such a backlog the gate follows the reading, a round behind the markers read,
  where it waited for an end noted only once the one before it was reached;
- an answer stamped in the future (a forger's, a clock ahead) is forgotten with the
  window like any other, not kept for ever;
- readiness turns red, with the reason, while the gate stands still.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from delayservice.level.markers import read_targets
from delayservice.level.markers import reader as marker_reader
from delayservice.markers.replies import reply_key
from tests.level.fakes import message
from tests.level.markers.reading import Reading, cancel_on, reading_rig

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


def _flood(
    reading: Reading, monkeypatch: pytest.MonkeyPatch, batches: int, look: Callable[[int], None]
) -> list[int]:
    """A flood on markers partition 0 three times as fast as it is read (30 markers and
    10 ms of the clock each batch of 10 read, for `batches` batches), after a backlog of
    100, the reader's monotonic clock stepping a round every batch. `look(n)` runs at
    the n-th batch, before its markers. Returns the count of batches asked for."""
    monkeypatch.setattr(marker_reader, "BATCH", 10)
    monkeypatch.setattr(marker_reader, "PASS_TIMEOUT_S", 10_000.0)
    monkeypatch.setattr(marker_reader, "time", _Stepping())  # a round every batch
    consume, calls = reading.fake.consume, [0]

    def flooding(num_messages: int = 1, timeout: float = -1) -> list[Any]:
        calls[0] += 1
        look(calls[0])
        if calls[0] <= batches:
            reading.clock.advance(0.01)
            for _ in range(30):
                cancel_on(reading, 0)
        return consume(num_messages, timeout)

    reading.fake.consume = flooding  # type: ignore[method-assign]
    for _ in range(100):  # begun before the pass
        cancel_on(reading, 0)
    return calls


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


@pytest.mark.parametrize("max_targets", [read_targets.MAX_TARGETS, 4])
def test_behind_a_growing_flood_the_gate_follows_what_was_read(
    reading: Reading, monkeypatch: pytest.MonkeyPatch, max_targets: int
) -> None:
    """Markers are appended three times as fast as they are read, 10 ms of the clock a
    batch. A record waits for the markers appended before its time, so the gate must
    stand at most a few batches behind the append time of the first marker not read yet,
    and never past it. With one end at a time, the next noted only once the one before
    was reached, it fell ever further behind (990 ms here): a million markers held the
    flooded partition's records 30 s. A queue of ends kept short (4) thins itself and
    still never lets the gate past a marker not read."""
    monkeypatch.setattr(read_targets, "MAX_TARGETS", max_targets)
    worst = [0]
    tp = (reading.markers, 0)

    def look(call: int) -> None:
        log = reading.fake.logs.get(tp, [])
        at = reading.reader._read_to.get(tp, 0)
        if at < len(log):
            first_unread_ms = log[at].timestamp()[1]
            through = reading.gate.through_for(0)
            assert through <= first_unread_ms, "the gate passed a marker not read yet"
            if call > 20:  # the first ends noted, behind the flood
                worst[0] = max(worst[0], first_unread_ms - through)

    calls = _flood(reading, monkeypatch, 300, look)
    while calls[0] <= 300:  # passes, one after another, while the flood lasts
        reading.reader._pass(reading.consumer)
    if max_targets > 4:  # the queue as it is, not one kept short on purpose
        assert worst[0] <= 50, f"the gate stood {worst[0]} ms behind the markers read"
    reading.reader._pass(reading.consumer)  # the rest of the flood
    assert reading.gate.through_for(0) >= reading.clock.ms() - 200


def test_behind_a_flood_the_lag_metric_and_readiness_follow_the_gate_mid_pass(
    reading: Reading, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass behind a growing flood does not end until the flood is read, so what was
    reported at a pass's end stood still: the lag metric (and its alert, at 30 s) read
    the last pass's figure while the flooded partition fell behind. It is reported every
    round, and readiness holds while the gate moves."""
    monkeypatch.setattr(reading.reader._thread, "is_alive", lambda: True)  # stepped here
    registry = reading.reader._metrics.registry
    seen: list[tuple[float | None, float]] = []
    ready: list[str] = []

    def look(call: int) -> None:
        if call > 20:
            lag = registry.get_sample_value("delayservice_level_markers_lag_seconds")
            seen.append((lag, (reading.clock.ms() - reading.gate.through_ms) / 1000))
            ready.append(reading.reader.health()[1])

    # Behind, but not so far that the queue of ends thins.
    calls = _flood(reading, monkeypatch, 100, look)
    reading.reader._advanced_at = marker_reader.time.monotonic()  # on the stepping clock
    reading.reader._pass(reading.consumer)  # one pass: it ends once the flood is read
    assert calls[0] > 100
    behind = [(lag, true) for lag, true in seen if true > 0.5]
    assert behind, "the flood never put the gate half a second behind: nothing was tested"
    worst = max(abs((lag or 0.0) - true) for lag, true in seen)
    assert worst <= 0.05, f"the lag metric was {worst:.2f} s off the gate's lag mid-pass"
    unready = sorted(set(ready) - {"markers: read"})
    assert not unready, f"not ready while the gate moved: {unready[:2]}"


def test_a_start_behind_a_flood_still_being_written_says_ready_once_each_partition_was_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Readiness after a start waits for the ends noted at the start, as before; a pass
    behind a flood that goes on being written ends only once it is read, so waiting for
    the pass's end kept a restarted daemon unready for minutes behind a million markers
    (fault row 31), its records flowing all the while."""
    reading = reading_rig(monkeypatch, first_pass=False)
    monkeypatch.setattr(reading.reader._thread, "is_alive", lambda: True)  # stepped here
    ready_at: list[int] = []

    def look(call: int) -> None:
        if not ready_at and reading.reader.health()[0]:
            ready_at.append(call)

    _flood(reading, monkeypatch, 200, look)  # its backlog: what the start finds
    assert not reading.reader.health()[0]
    reading.reader._pass(reading.consumer)
    assert ready_at, "never ready while the flood was read"
    assert ready_at[0] <= 20, f"ready after {ready_at[0]} batches: 100 markers take 10"


def test_a_pass_behind_a_flood_reports_the_book_as_it_goes(
    reading: Reading, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass behind a flood that goes on being written ends only once it is read; what
    its end did (let go of what no record needs, report the book's size and count) must
    not wait for that: the gauges stood at the last pass's figures while the book grew."""
    registry = reading.reader._metrics.registry
    seen: list[tuple[float, int]] = []

    def look(call: int) -> None:
        if call <= 100:
            gauge = registry.get_sample_value("delayservice_level_markers_book_bytes")
            seen.append((gauge or 0.0, reading.book.total_bytes))

    calls = _flood(reading, monkeypatch, 100, look)
    reading.reader._next_forget = 0.0  # on the stepping clock
    while calls[0] <= 100:
        reading.reader._pass(reading.consumer)
    gauge, held = seen[-1]
    assert held > 50_000, f"the book holds {held} bytes: nothing was tested"
    assert gauge >= 0.9 * held, f"the book's gauge said {gauge:.0f} bytes of {held}"


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
