"""The marker gate's waiting list against the threads that touch it at once: a
partition group's forwarder asks (`want`) while the reader moves the gate (`advance`)
or looks for the next time it is wanted (`next_wanted_ms`).

Each test forces the interleaving instead of hoping for it: the list is a dict that,
while the reader's side walks it, has a second thread ask for the gate and waits a
moment for that ask to land. Unguarded, the ask lands in the middle of the walk: it is
dropped with the dict `advance` replaces (the forwarder then sleeps with no deadline),
or the walk fails with "dictionary changed size during iteration" (the reader then
reopens and reads its whole window again). Guarded, the ask waits for the walk to end
and is kept."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from delayservice.level.markers.gate import MarkerGate

LANDS_S = 0.2
"""How long the walk waits for the other thread's ask: it lands at once unless a lock
holds it back."""


class _AskDuringWalk(dict[int, Any]):
    """A waiting list whose first walk over `at` ("values" or "items") has `ask` run on
    another thread: after the walk's first entry, or, `copied`, once the walk is over
    and only its result is left to store."""

    def __init__(self, ask: Callable[[], None], at: str, *, copied: bool) -> None:
        super().__init__()
        self._ask = ask
        self._at = at
        self._copied = copied
        self.asker: threading.Thread | None = None

    def _interleave(self) -> None:
        if self.asker is not None:
            return
        self.asker = threading.Thread(target=self._ask, name="asker", daemon=True)
        self.asker.start()
        self.asker.join(LANDS_S)

    def _walk(self, at: str, entries: Iterator[Any]) -> Iterator[Any]:
        if at != self._at:
            yield from entries
            return
        if self._copied:  # the walk is done with the dict: only its result is left to store
            yield from list(entries)
            self._interleave()
            return
        for n, entry in enumerate(entries):
            yield entry
            if n == 0:
                self._interleave()

    def values(self) -> Any:
        return self._walk("values", iter(super().values()))

    def items(self) -> Any:
        return self._walk("items", iter(super().items()))


def _gate_waiting_on(group: int, due_ms: int, wake: Callable[[], None]) -> MarkerGate:
    gate = MarkerGate(lead_ms=10)
    gate.start(0)
    gate.advance(1_000, 1_000, gate.generation)
    gate.want(group, due_ms, wake)
    return gate


def _swap_in(gate: MarkerGate, ask: Callable[[], None], at: str, *, copied: bool) -> _AskDuringWalk:
    racing = _AskDuringWalk(ask, at, copied=copied)
    racing.update(gate._wants)
    gate._wants = racing
    return racing


def test_an_ask_while_the_gate_moves_is_kept_and_woken_by_the_next_move() -> None:
    woken: list[str] = []
    gate = _gate_waiting_on(1, 1_500, lambda: woken.append("first"))
    ask = lambda: gate.want(2, 5_000, lambda: woken.append("second"))  # noqa: E731
    # Group 2 asks once `advance` has built the list it keeps, before it stores it.
    racing = _swap_in(gate, ask, "items", copied=True)
    gate.advance(2_000, None, gate.generation)  # wakes group 1
    assert racing.asker is not None
    racing.asker.join(5)
    assert woken == ["first"]
    assert gate.next_wanted_ms() == 5_000, "the ask made while the gate moved was dropped"
    gate.advance(6_000, None, gate.generation)
    assert woken == ["first", "second"]


def test_an_ask_while_the_reader_looks_for_the_next_wanted_time_breaks_nothing() -> None:
    gate = _gate_waiting_on(1, 3_000, lambda: None)
    racing = _swap_in(gate, lambda: gate.want(2, 2_000, lambda: None), "values", copied=False)
    assert gate.next_wanted_ms() == 3_000  # raised "dictionary changed size" unguarded
    assert racing.asker is not None
    racing.asker.join(5)
    assert gate.next_wanted_ms() == 2_000


def test_an_ask_while_the_gate_wakes_the_waiting_breaks_nothing() -> None:
    woken: list[int] = []
    gate = _gate_waiting_on(1, 1_500, lambda: woken.append(1))
    ask = lambda: gate.want(2, 1_800, lambda: woken.append(2))  # noqa: E731
    racing = _swap_in(gate, ask, "items", copied=False)
    gate.advance(2_000, None, gate.generation)  # raised "dictionary changed size" unguarded
    assert racing.asker is not None
    racing.asker.join(5)
    gate.advance(2_100, None, gate.generation)
    assert sorted(woken) == [1, 2]
