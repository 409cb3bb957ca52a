"""How far the level markers have been read, and so what the level forwarders may send.

A cancel the broker acknowledged before its message's due time must be honoured, even
when the message's partition is far behind. So every daemon reads the whole markers
topic (`reader`), and a forwarder sends a record only once every marker appended
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

The gate is kept per markers partition. A marker goes to the markers partition its
id's level partition names (`level_ids.marker_partition`: level partition p to p
modulo the markers topic's count), so a record of level partition p needs only the
markers partitions that can hold its markers read (`through_for`): p modulo the count;
p modulo an earlier count this process saw, for markers appended up to `OLD_COUNT_MS`
after the topic grew (a producer that has not seen it grown yet still uses the old
count); and any partition a marker of p was found on elsewhere (`misplaced`: an older
SDK spread markers by a hash of the id). A
flood of markers on one partition then holds back only the records whose markers go
there. `through_ms` is what every partition has been read through (a partition added
while the reader runs holds it back until read, and only the records whose markers
may be there); after a start or a rewind, nothing goes until every partition was
read once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Final

from delayservice.forward.buffer import TP
from delayservice.markers.topic_partitions import REFRESH_S

BLOCKED: Final = -1
"""`through_ms` while nothing may go: before the first read, during a rewind."""
FOREVER: Final = 2**62
OLD_COUNT_MS: Final = int((REFRESH_S + 60) * 1000)
"""How long after the markers topic grew a producer may still place markers by the
old count: it looks for added partitions every `REFRESH_S`."""

Homes = tuple[tuple[int, int], ...]
"""(markers partition, the append time before which it may hold the markers) pairs."""


class MarkerGate:
    def __init__(self, lead_ms: int) -> None:
        self.lead_ms = lead_ms
        self.through_ms = BLOCKED
        """Every marker appended before this (broker time, epoch ms) has been read."""
        self._shut = True
        """From a start or a rewind until every markers partition was read once."""
        self.outcomes_through_ms = BLOCKED
        """Every committed answer written before this has been read."""
        self.covered_from_ms: int | None = None
        """The reader has every marker appended since this (None: not started)."""
        self.generation = 0
        """Counts rewinds: a read that began before one does not move the gate."""
        self._rewind_to: int | None = None
        self.needs: dict[TP, int] = {}
        """Per partition held, the earliest marker time its records may need."""
        self._wants: dict[tuple[int, int | None], tuple[int, Callable[[], None]]] = {}
        """(group, level partition or None for all) -> (due time, wake)."""
        self._parts: dict[int, int] = {}
        """Markers partition -> every marker on it appended before this was read."""
        self._outcome_parts: dict[int, int] = {}
        self._count: int | None = None
        """The markers topic's partition count as last listed."""
        self._old_counts: dict[int, int] = {}
        """Earlier counts -> until when (append time) producers may still use them."""
        self._extra: dict[int, set[int]] = {}
        """Level partition -> markers partitions a marker of it was found on that the
        counts do not name."""
        self._homes: dict[int, Homes] = {}
        """Level partition -> the markers partitions its markers can be on (a cache)."""
        self._lock = threading.Lock()
        self.demand = threading.Event()
        """Set when a group waits for the gate, or a rewind is asked for."""

    # -- the partition groups' side (any thread) -------------------------------------
    # Lock order: a group's lock, then this gate's; never the other way round. So
    # nothing here calls into a group while holding `_lock` (`advance` wakes the groups
    # after letting it go).
    def want(
        self, group: int, due_ms: int, wake: Callable[[], None], partition: int | None = None
    ) -> None:
        """Group `group` has a record due at `due_ms` that waits for the gate (of level
        partition `partition`; None: for every partition read): `wake` it once the gate
        has passed that. Called under the group's own lock, so it only writes a dict
        entry (under the gate's lock: the reader's `advance` replaces the dict) and sets
        an event. An earlier wish for the same partition stands: its wake comes first,
        and the group asks again then."""
        key = (group, partition)
        with self._lock:
            known = self._wants.get(key)
            if known is not None and known[0] <= due_ms:
                return
            self._wants[key] = (due_ms, wake)
        self.demand.set()

    def through_for(self, partition: int) -> int:
        """Every marker of level partition `partition`'s messages appended before this
        (broker time, epoch ms) has been read; BLOCKED while none may go."""
        return self._through(self._cached_homes(partition))

    def through_named(self, partition: int) -> int:
        """`through_for` of a partition read off a record's id, which anyone who may
        write a level topic writes: worked out each time, never kept (`_homes` keeps
        only the partitions the daemon itself holds or has markers for)."""
        with self._lock:
            return self._through(self._homes_of(partition))

    def _through(self, homes: Homes) -> int:
        """How far markers partitions `homes` are read through (none: all of them). A
        home of an earlier count counts until it is read past the time it may hold
        markers until."""
        if self._shut or not homes:
            return self.through_ms
        parts = self._parts
        low = FOREVER
        for home, until in homes:
            at = parts.get(home, BLOCKED)
            if at < until and at < low:
                low = at
        return low

    def read_before(self, partition: int, appended_ms: int, on: int) -> bool:
        """Whether every marker of level partition `partition`'s messages that can come
        before one appended at `appended_ms` on markers partition `on` has been read.
        `on` is read in order; its other homes (an earlier count's, a misplaced one's)
        must be read past that time. A move waits for this: carried out before a cancel
        that came first on another partition, it leaves the cancel only the withdrawn
        original, and the copy goes. Only the homes known count: after a start, a move
        does not wait for every partition to be read once (a marker an older SDK put
        elsewhere, not found yet, is not waited for)."""
        homes = self._cached_homes(partition)
        if not homes:
            return self.through_ms > appended_ms
        parts = self._parts
        return all(
            parts.get(home, BLOCKED) >= min(appended_ms + 1, until)
            for home, until in homes
            if home != on
        )

    def _homes_of(self, partition: int) -> Homes:
        """Under the lock."""
        homes: dict[int, int] = {}
        if self._count is not None:
            homes[partition % self._count] = FOREVER
        for home in self._extra.get(partition, ()):
            homes[home] = FOREVER
        for count, until in self._old_counts.items():
            home = partition % count
            homes[home] = max(homes.get(home, 0), until)
        return tuple(sorted(homes.items()))

    def markers_count(self, count: int, now_ms: int) -> None:
        """The markers topic has `count` partitions (listed by the reader at `now_ms`)."""
        with self._lock:
            if count == self._count:
                return
            if self._count is not None:
                self._old_counts[self._count] = now_ms + OLD_COUNT_MS
            self._old_counts.pop(count, None)
            self._count = count
            self._homes = {}

    def misplaced(self, partition: int, home: int) -> None:
        """A marker of level partition `partition` was found on markers partition
        `home`, which the counts do not name for it: its records wait for that one too."""
        with self._lock:
            if home in dict(self._homes_of(partition)):
                return
            self._extra.setdefault(partition, set()).add(home)
            self._homes.pop(partition, None)

    def home_of(self, partition: int) -> tuple[int, ...]:
        """The markers partitions level partition `partition`'s markers can be on."""
        return tuple(home for home, _ in self._cached_homes(partition))

    def is_home(self, partition: int, home: int) -> bool:
        """Whether `home` is among `home_of(partition)`, without making the tuple (the
        reader asks for every marker it reads; a loop, as `any` over a generator costs
        about as much as the tuple)."""
        for known, _ in self._cached_homes(partition):  # noqa: SIM110
            if known == home:
                return True
        return False

    def _cached_homes(self, partition: int) -> Homes:
        """Without the lock when cached (the forwarding path asks for every run)."""
        homes = self._homes.get(partition)
        if homes is None:
            with self._lock:
                homes = self._homes_of(partition)
                self._homes[partition] = homes
        return homes

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
                self._shut = True
                self._parts = dict.fromkeys(self._parts, BLOCKED)
                # The answers to the markers forgotten went with them: a new owner must
                # not take a predecessor's moves as known until they are read again.
                self._outcome_parts = dict.fromkeys(self._outcome_parts, BLOCKED)
                self.outcomes_through_ms = BLOCKED
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
        """A read that began at these times (None: not this one) reached the end of
        every partition: move the gate, unless a rewind was asked for since, and wake
        the groups waiting."""
        with self._lock:
            markers = dict.fromkeys(self._parts, markers_ms) if markers_ms is not None else {}
            outcomes = (
                dict.fromkeys(self._outcome_parts, outcomes_ms) if outcomes_ms is not None else {}
            )
        self.advance_parts(markers, outcomes, generation, (markers_ms, outcomes_ms))

    def advance_parts(
        self,
        markers: dict[int, int],
        outcomes: dict[int, int],
        generation: int,
        unlisted: tuple[int | None, int | None] = (None, None),
    ) -> None:
        """Reads that began at these times reached the ends of these partitions (of the
        markers topic, of the outcomes topic): move the gate, unless a rewind was asked
        for since, and wake the groups waiting. `through_ms` is what the partition read
        least far was read through (`unlisted`: the times, when no partition was ever
        named to the gate). It stays shut after a rewind until every partition has been
        read again; a partition added later shuts only the records it may concern."""
        with self._lock:
            if generation != self.generation or self._rewind_to is not None:
                return
            parts, outcome_parts = self._parts, self._outcome_parts
            for partition, ms in markers.items():
                if ms > parts.get(partition, BLOCKED):
                    parts[partition] = ms
            for partition, ms in outcomes.items():
                if ms > outcome_parts.get(partition, BLOCKED):
                    outcome_parts[partition] = ms
            if parts:
                self.through_ms = min(parts.values())
            elif unlisted[0] is not None and unlisted[0] > self.through_ms:
                self.through_ms = unlisted[0]
            self._shut = self._shut and self.through_ms < 0
            outcomes_ms = min(outcome_parts.values()) if outcome_parts else unlisted[1]
            if outcomes_ms is not None and outcomes_ms > self.outcomes_through_ms:
                self.outcomes_through_ms = outcomes_ms
            ready = []
            waiting = {}
            for key, (due_ms, wake) in self._wants.items():
                wanted = key[1]
                homes = () if wanted is None else self._homes_of(wanted)
                if due_ms <= self._through(homes):
                    ready.append(wake)
                else:
                    waiting[key] = (due_ms, wake)
            self._wants = waiting
        for wake in ready:
            wake()

    def read_parts(self, markers: list[int], outcomes: list[int]) -> None:
        """The partitions the reader reads now: each one new is shut until read."""
        with self._lock:
            for partition in markers:
                if self._parts.setdefault(partition, BLOCKED) < 0:
                    self.through_ms = BLOCKED
            for partition in outcomes:
                if self._outcome_parts.setdefault(partition, BLOCKED) < 0:
                    self.outcomes_through_ms = BLOCKED

    def next_wanted_ms(self) -> int | None:
        """The earliest due time a group waits for, if any."""
        with self._lock:
            return min((due for due, _ in self._wants.values()), default=None)

    def rewind_asked(self) -> bool:
        return self._rewind_to is not None
