"""What a forwarder sent since its last commit point, in one place.

A commit point makes the interval durable and commits, per delay-topic partition, the
offset after the last record sent; a refusal, an aborted transaction or an unknown
outcome sends it again or drops it. Everything those decisions read is here, keyed by
(topic, partition), and each of the three endings resets it in one call: `settle` (it
committed), `requeue` (it goes again from the buffer) and `reset` (its outcome is
unknown: the consumer thread reads again from the committed offsets). Kafka Streams
splits the same concerns over `RecordCollector`, `StreamsProducer` and
`TaskManager.commit`; quix-streams keeps one `Checkpoint`.

Owned by the forwarder thread: the sender writes its notes here as it sends (records
re-published, dead letters, lateness, failed deliveries), `Failures` reads them.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any, Protocol

from delayservice.forward.buffer import TP, Buffer, Runs
from delayservice.forward.failures import PURGED, Doom, Key, Report
from delayservice.forward.held_record import offset_of


class Listener(Protocol):
    """Told how each interval ends, for decisions taken beside its records (level
    mode's markers: `level.markers.actions`)."""

    def open(self) -> bool:
        """Whether it holds decisions this interval must commit."""
        ...

    def settled(self) -> None: ...

    def dropped(self, spots: set[Key] | None = None, tps: set[TP] | None = None) -> None:
        """All of them (no argument), or those about `spots` or `tps`, will not commit."""
        ...

    def decided_on(self) -> dict[TP, int | None]:
        """The partitions it holds decisions about, each with the offset of the first
        record still queued there (None: none is)."""
        ...


Waiting = dict[TP, dict[int, tuple[int, Any]]]
"""At-least-once: partition -> offset -> (not before, epoch ms; record), for records that
failed and go again on their own, apart from their partition's queue."""


class OpenInterval:
    def __init__(self, buffer: Buffer) -> None:
        self._buffer = buffer
        self.runs: Runs = []
        """What was sent, in order, as it was taken."""
        self.sent_through: dict[TP, int] = {}
        """The offset after the last record sent, per partition."""
        self.committed: dict[TP, int] = {}
        """The offset last committed, per partition (kept across intervals)."""
        self.waiting: Waiting = {}
        self.taken_from: dict[TP, int | None] = {}
        """The assignment (`Buffer.incarnation`) each partition's open records came from."""
        # The interval's notes, written by the sender as it sends.
        self.rerouted: dict[Key, str] = {}
        """Records re-published to another delay topic, and where."""
        self.dead_sent: dict[Key, Doom] = {}
        """Dead letters sent, counted once they commit."""
        self.withdrawn: dict[Key, str] = {}
        """Records a marker withdrew (sent nowhere, committed), and why."""
        self.listener: Listener | None = None
        self.lateness: dict[str, list[tuple[int, int]]] = {}
        """Per delay topic, (ms between due time and send, forwards)."""
        self.reports: list[Report] = []
        """Failed deliveries, filled while the producer is served (poll, flush)."""

    def __bool__(self) -> bool:
        """Whether anything was sent (or decided) since the last commit point."""
        return bool(self.runs) or (self.listener is not None and self.listener.open())

    def took(self, tp: TP) -> None:
        """Records of `tp` are about to be sent: note which assignment they came from."""
        if tp not in self.taken_from:
            self.taken_from[tp] = self._buffer.incarnation(tp)

    def add(self, tp: TP, records: list[Any]) -> None:
        """`records` of `tp` went out, in order (a record set aside goes out after later
        ones: the partition's mark never moves back)."""
        self.runs.append((tp, records))
        after = offset_of(records[-1]) + 1
        if after > self.sent_through.get(tp, -1):
            self.sent_through[tp] = after

    def put_back(self, tp: TP, records: list[Any], not_before_ms: int = 0) -> None:
        """Taken records of `tp` that were not sent go back to the front of their queue
        (not to a partition assigned anew since they were taken)."""
        self._buffer.put_back(tp, records, not_before_ms, self.taken_from.get(tp))

    def set_aside(
        self, again: set[Key], failing: Container[Key], now_ms: int, backoff_ms: int
    ) -> None:
        """At-least-once: the records to send again leave the interval and wait on their
        own (`waiting`; those still failing for `backoff_ms`): the rest of their
        partition goes on, and its commits stop below them."""
        kept: Runs = []
        for tp, records in self.runs:
            stay = []
            for record in records:
                spot = (tp[0], tp[1], offset_of(record))
                if spot in again:
                    wait = backoff_ms if spot in failing else 0
                    self.waiting.setdefault(tp, {})[spot[2]] = (now_ms + wait, record)
                    self.dead_sent.pop(spot, None)
                    self.rerouted.pop(spot, None)
                    self.withdrawn.pop(spot, None)
                else:
                    stay.append(record)
            if stay:
                kept.append((tp, stay))
        self.runs = kept
        if self.listener is not None and again:
            self.listener.dropped(spots=set(again))

    def waiting_until_ms(self) -> int | None:
        """When the first record set aside may go again."""
        return min(
            (until for held in self.waiting.values() for until, _ in held.values()),
            default=None,
        )

    def fenced(self, offsets: dict[TP, int]) -> dict[TP, int]:
        """`offsets`, with every partition the listener decided about in this interval
        where it stands (the offset after the last record sent, else its first record
        still queued).

        Exactly-once: the group coordinator takes a transaction's offsets only from the
        member of the group's current generation, and a read_committed member newly
        assigned a partition starts only once no open transaction holds offsets of it.
        A move made ahead of its message (a copy; the original stays queued) is a
        decision with no record sent, and its transaction held no offset of the
        partition: a member whose session expired under it (a starved or frozen host)
        committed the copy after the partition's next owner had read which moves were
        made, and both made the copy. With the offset, one of the two waits for the
        other, or the late one is refused."""
        decided = self.listener.decided_on() if self.listener is not None else {}
        out = dict(offsets)
        for tp, first_queued in decided.items():
            at = self.sent_through.get(tp, first_queued)
            if tp not in out and at is not None:
                out[tp] = at
        return out

    def committable(self) -> dict[TP, int]:
        """Per partition, the offset after the last record sent, but never past a record
        still waiting to go again (at-least-once), where it moved since the last commit."""
        out: dict[TP, int] = {}
        waiting = self.waiting
        for tp, sent_through in self.sent_through.items():
            held = waiting.get(tp)
            offset = min(sent_through, *held) if held else sent_through
            if self.committed.get(tp) != offset:
                out[tp] = offset
        return out

    def settle(self, offsets: dict[TP, int]) -> Runs:
        """The interval committed `offsets`: returns what it sent, and starts anew."""
        self.committed.update(offsets)
        runs, self.runs = self.runs, []
        self.taken_from = {tp: i for tp, i in self.taken_from.items() if tp in self.waiting}
        self.rerouted.clear()
        self.dead_sent.clear()
        self.withdrawn.clear()
        if self.listener is not None:
            self.listener.settled()
        return runs

    def take_lateness(self) -> dict[str, list[tuple[int, int]]]:
        lateness, self.lateness = self.lateness, {}
        return lateness

    def requeue(self, holds: dict[TP, int]) -> None:
        """The interval goes again (its transaction was aborted, or librdkafka inferred a
        success in it): everything it sent goes back to the front of its partition's
        queue, in offset order, and is sent again (`holds`: not before, epoch ms)."""
        runs, self.runs = self.runs, []
        again: dict[TP, list[Any]] = {}
        for tp, records in runs:
            again.setdefault(tp, []).extend(records)
        for tp, records in again.items():
            records.sort(key=offset_of)  # a record sent again on its own came after later ones
            committed = self.committed.get(tp)
            if committed is None:
                self.sent_through.pop(tp, None)
            else:
                self.sent_through[tp] = committed
            self.put_back(tp, records, holds.get(tp, 0))
        self._notes_dropped()

    def reset(self) -> None:
        """Its outcome is unknown: nothing it holds is sent again from memory (the caller
        has the consumer thread read again from the committed offsets)."""
        self.runs = []
        self.taken_from.clear()
        self.waiting.clear()
        self.sent_through = dict(self.committed)
        self._notes_dropped()

    def drop(self, tps: set[TP]) -> None:
        """What was sent of `tps` never commits here (they were lost)."""
        self.runs = [(tp, r) for tp, r in self.runs if tp not in tps]
        if self.listener is not None:
            self.listener.dropped(tps=tps)

    def forget(self, tps: set[TP]) -> None:
        """`tps` are no longer this forwarder's: every trace of them goes."""
        self.drop(tps)
        for table in (self.sent_through, self.committed, self.waiting, self.taken_from):
            for tp in tps:
                table.pop(tp, None)
        for notes in (self.rerouted, self.dead_sent, self.withdrawn):
            for spot in [s for s in notes if s[:2] in tps]:
                del notes[spot]

    def _notes_dropped(self) -> None:
        # An abort serves a purge report for every record librdkafka still held; those
        # records go again with the interval (or are read again), so the reports name no
        # failure. Kept, they cost the next transaction an abort and a backoff.
        self.reports = [r for r in self.reports if r[0].code() not in PURGED]
        self.taken_from = {tp: i for tp, i in self.taken_from.items() if tp in self.waiting}
        self.rerouted.clear()
        self.dead_sent.clear()
        self.withdrawn.clear()
        self.lateness = {}
        if self.listener is not None:
            self.listener.dropped()
