"""How far the level markers have been read, and so what the level forwarders may send.

A cancel the broker acknowledged before its message's due time must be honoured, even
when the message's partition is far behind. So every daemon reads the whole markers
topic (`marker_reader`), and a forwarder sends a record only once every marker appended
before the record's due time has been read: `through_ms`. The reader moves it by
noting the time, asking the broker where the markers topic ends, and reading up to
there; every marker acknowledged before that time is then in memory. A record due later
waits (late, never early), and its group asks for it (`want`): the reader reads again
at once, or at the due time, and wakes the group.

Where the reader starts matters as much: a record's cancel may have been appended up
to `lead_ms` before the record itself. Each partition group says which records it
holds (`need`: the append time of the first record of each run handed over, so no
per-record work), and when a partition holds records older than what the reader
covers, it reads again from there (`rewind`) and nothing is sent meanwhile. What the
forwarders committed (`progress`) lets the book forget markers no record waiting can
need.

The reader also reads the outcomes topic, where the daemons record the moves they
carried out: `outcomes_through_ms` says up to when those are known.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Final

from delayservice.forward.buffer import TP

BLOCKED: Final = -1
"""`through_ms` while nothing may go: before the first read, during a rewind."""


class MarkerGate:
    def __init__(self, lead_ms: int) -> None:
        self.lead_ms = lead_ms
        self.through_ms = BLOCKED
        """Every marker appended before this (broker time, epoch ms) has been read."""
        self.outcomes_through_ms = BLOCKED
        """Every committed answer written before this has been read."""
        self.covered_from_ms: int | None = None
        """The reader has every marker appended since this (None: not started)."""
        self.generation = 0
        """Counts rewinds: a read that began before one does not move the gate."""
        self._rewind_to: int | None = None
        self.needs: dict[TP, int] = {}
        """Per partition held, the earliest marker time its records may need."""
        self._wants: dict[int, tuple[int, Callable[[], None]]] = {}
        self._lock = threading.Lock()
        self.demand = threading.Event()
        """Set when a group waits for the gate, or a rewind is asked for."""

    # -- the partition groups' side (any thread) -------------------------------------
    # Lock order: a group's lock, then this gate's; never the other way round. So
    # nothing here calls into a group while holding `_lock` (`advance` wakes the groups
    # after letting it go).
    def want(self, group: int, due_ms: int, wake: Callable[[], None]) -> None:
        """Group `group` has a record due at `due_ms` that waits for the gate: `wake`
        it once the gate has passed that. Called under the group's own lock, so it only
        writes a dict entry (under the gate's lock: the reader's `advance` replaces the
        dict) and sets an event."""
        with self._lock:
            known = self._wants.get(group)
            if known is not None and known[0] == due_ms:
                return
            self._wants[group] = (due_ms, wake)
        self.demand.set()

    def need(self, tp: TP, appended_ms: int) -> None:
        """Records of `tp` appended at `appended_ms` or later were handed over: they may
        need markers from `lead_ms` before that."""
        need = appended_ms - self.lead_ms
        with self._lock:
            known = self.needs.get(tp)
            if known is None or need < known:
                self.needs[tp] = need
            covered = self.covered_from_ms
            if covered is not None and need < covered:
                self._rewind_to = need if self._rewind_to is None else min(need, self._rewind_to)
                self.through_ms = BLOCKED  # before the records can be taken
                self.generation += 1
                self.demand.set()

    def progress(self, tp: TP, appended_ms: int) -> None:
        """Every record of `tp` appended before `appended_ms` is committed."""
        need = appended_ms - self.lead_ms
        with self._lock:
            known = self.needs.get(tp)
            if known is not None and need > known:
                self.needs[tp] = need

    def release(self, tps: Iterable[TP]) -> None:
        with self._lock:
            for tp in tps:
                self.needs.pop(tp, None)

    def earliest_need(self) -> int | None:
        with self._lock:
            return min(self.needs.values(), default=None)

    # -- the reader's side ---------------------------------------------------------
    def start(self, from_ms: int) -> None:
        with self._lock:
            self.covered_from_ms = from_ms

    def take_rewind(self) -> tuple[int, int] | None:
        """(where to read again from, the generation it serves), once asked for."""
        with self._lock:
            if self._rewind_to is None:
                return None
            to, self._rewind_to = self._rewind_to, None
            self.covered_from_ms = (
                to if self.covered_from_ms is None else min(to, self.covered_from_ms)
            )
            return to, self.generation

    def forget_before(self, from_ms: int) -> None:
        """Markers appended before `from_ms` were dropped from memory: a partition that
        needs them now makes the reader read them again."""
        with self._lock:
            if self.covered_from_ms is None or from_ms > self.covered_from_ms:
                self.covered_from_ms = from_ms

    def advance(self, markers_ms: int | None, outcomes_ms: int | None, generation: int) -> None:
        """A read that began at these times (None: not this one) reached the end: move
        the gate, unless a rewind was asked for since, and wake the groups waiting."""
        with self._lock:
            if generation != self.generation or self._rewind_to is not None:
                return
            if markers_ms is not None and markers_ms > self.through_ms:
                self.through_ms = markers_ms
            if outcomes_ms is not None and outcomes_ms > self.outcomes_through_ms:
                self.outcomes_through_ms = outcomes_ms
            through = self.through_ms
            ready = [wake for due_ms, wake in self._wants.values() if due_ms <= through]
            self._wants = {g: w for g, w in self._wants.items() if w[0] > through}
        for wake in ready:
            wake()

    def next_wanted_ms(self) -> int | None:
        """The earliest due time a group waits for, if any."""
        with self._lock:
            return min((due for due, _ in self._wants.values()), default=None)

    def rewind_asked(self) -> bool:
        return self._rewind_to is not None
