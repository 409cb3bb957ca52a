"""The marker gate's waiting list against the threads that touch it at once: a
partition group's forwarder asks (`want`) while the reader moves the gate (`advance`)
or looks for the next time it is wanted (`next_wanted_ms`).

Each test forces the interleaving instead of hoping for it (`interleaving.py`): while
the reader's side walks the list, a second thread asks for the gate, and the walk goes
on only once that ask has landed or waits for the gate's lock. Unguarded, the ask lands
in the middle of the walk: it is dropped with the dict `advance` replaces (the
forwarder then sleeps with no deadline), or the walk fails with "dictionary changed
size during iteration" (the reader then reopens and reads its whole window again).
Guarded, the ask waits for the walk to end and is kept."""

from __future__ import annotations

from collections.abc import Callable

from delayservice.level.markers.gate import MarkerGate
from tests.level.markers.interleaving import run_during_walk


def _gate_waiting_on(group: int, due_ms: int, wake: Callable[[], None]) -> MarkerGate:
    gate = MarkerGate(lead_ms=10)
    gate.start(0)
    gate.advance(1_000, 1_000, gate.generation)
    gate.want(group, due_ms, wake)
    return gate


def test_an_ask_while_the_gate_moves_is_kept_and_woken_by_the_next_move() -> None:
    woken: list[str] = []
    gate = _gate_waiting_on(1, 1_500, lambda: woken.append("first"))
    ask = lambda: gate.want(2, 5_000, lambda: woken.append("second"))  # noqa: E731
    # Group 2 asks once `advance` has built the list it keeps, before it stores it.
    racing, disarm = run_during_walk(gate, ask, "items", copied=True)
    gate.advance(2_000, None, gate.generation)  # wakes group 1
    disarm()
    assert racing.done
    assert woken == ["first"]
    assert gate.next_wanted_ms() == 5_000, "the ask made while the gate moved was dropped"
    gate.advance(6_000, None, gate.generation)
    assert woken == ["first", "second"]


def test_an_ask_while_the_reader_looks_for_the_next_wanted_time_breaks_nothing() -> None:
    gate = _gate_waiting_on(1, 3_000, lambda: None)
    ask = lambda: gate.want(2, 2_000, lambda: None)  # noqa: E731
    racing, disarm = run_during_walk(gate, ask, "values", copied=False)
    assert gate.next_wanted_ms() == 3_000  # raised "dictionary changed size" unguarded
    disarm()
    assert racing.done
    assert gate.next_wanted_ms() == 2_000


def test_an_ask_while_the_gate_wakes_the_waiting_breaks_nothing() -> None:
    woken: list[int] = []
    gate = _gate_waiting_on(1, 1_500, lambda: woken.append(1))
    ask = lambda: gate.want(2, 1_800, lambda: woken.append(2))  # noqa: E731
    racing, disarm = run_during_walk(gate, ask, "items", copied=False)
    gate.advance(2_000, None, gate.generation)  # raised "dictionary changed size" unguarded
    disarm()
    assert racing.done
    gate.advance(2_100, None, gate.generation)
    assert sorted(woken) == [1, 2]
