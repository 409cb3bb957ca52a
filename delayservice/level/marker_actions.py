"""One level worker's side of cancel and reschedule: what its forwarder does with the
markers of the partitions it owns.

- Screening: a run taken from a partition some marker's id names is checked for those
  ids (a set lookup per record, only there); a record that matches takes the sender's
  full path, which asks `decide`.
- Deciding: the verdict (`marker_verdict`) on the record as taken at its due time:
  withdraw it (cancelled, or moved before), move it (a copy, re-published to the level
  that holds what is left, with `delay-moved-by`), or forward it.
- Serving: between sends, the owner looks for each new marker's message in its queue
  and answers at once: `cancelled` (it will be withdrawn when taken, which decides the
  same), `too_late`, or it moves the message now (a copy; the original stays queued and
  is withdrawn when its turn comes). A marker whose message is not there is answered
  once the message could no longer arrive: `too_late` (sent before the marker) or
  `unmatched` (never there), by the time the id says it was sent.

Every answer goes to the outcomes topic through the worker's own producer, so under
exactly-once a move, its answer and whatever it withdrew commit in one transaction;
all of it is noted in the book at once and taken back if the interval does not commit
(the open interval calls `settled`, `dropped`). The answer `moved` is what says a copy
exists, so under at-least-once it is written only after the flush that made the copy
durable (`settled`): a copy refused by the broker, or lost with a killed daemon, leaves
no answer behind, and the move is made again (twice at worst, never lost). A new owner
answers and moves nothing of a partition until it has read the answers written before
it took the partition over (`outcomes_through_ms`): those say which moves its
predecessor carried out.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Final

from delayservice.envelope import H_DELAY_MS, H_DUE_MS, H_ID, H_MOVED_BY, Envelope
from delayservice.forward.buffer import TP
from delayservice.forward.failures import Key
from delayservice.forward.held_record import ID, offset_of, record_of
from delayservice.forward.send_errors import SendLaterError
from delayservice.kafka.record_headers import read_headers
from delayservice.level.marker_book import FORWARDED, Action, MarkerBook
from delayservice.level.marker_entry import Entry
from delayservice.level.marker_gate import MarkerGate
from delayservice.level.marker_placing import UNMATCHED
from delayservice.level.marker_route import MarkerSender
from delayservice.level.marker_verdict import (
    CANCEL_IT,
    CLOSED,
    MOVE,
    MOVED,
    TOO_LATE,
    LevelMarker,
    Order,
    Verdict,
)
from delayservice.levels import LevelSet
from delayservice.markers.replies import CANCELLED, MarkerReply
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.partitioners import keyed_partition

LEAD_MS: Final = 10_000
"""How long after its marker a message may still reach the broker and be covered by it
(`DelayProducer.cancel` first waits for its own messages in flight)."""
SKEW_MS: Final = 5_000
"""How far a producer's clock (the send time in an id) may be off the broker's, for
telling a marker that came after its message's delivery from one for no message."""
CHECK_MS: Final = 200
"""How often the markers whose message was not found are looked at again, counted from
the end of the last serve pass: counted from its start, a pass slower than this (a
flood of markers, a loaded host) was followed by the next at once, and the forwarder
did nothing else while the reader waited for the book."""
SERVE_GAP_MS: Final = 50
"""The least time between the end of a serve pass and the next that a change of the
book asks for: while a flood is read, the book changes with every batch."""
EMPTY_GRACE_MS: Final = 5_000
SERVE_BATCH: Final = 2_000
"""The most markers of one partition a serve pass looks at (the next ones the next
time): a flood of markers waiting for an answer costs each pass of the forwarder a
batch, not the whole flood."""


def moved_by(marker: LevelMarker) -> bytes:
    return f"{marker.appended_ms}:{marker.partition}:{marker.offset}".encode()


def cursor_of(record: Any) -> Order | None:
    """Which marker made this copy (`delay-moved-by`), None for a message as first sent."""
    if type(record) is tuple:
        return None
    headers = read_headers(record)
    for name, value in headers if isinstance(headers, list) else ():
        if name == H_MOVED_BY and isinstance(value, bytes):
            parts = value.split(b":")
            if len(parts) == 3 and all(p.isdigit() for p in parts):
                return (int(parts[0]), int(parts[1]), int(parts[2]))
    return None


def id_of(record: Any) -> str | None:
    if type(record) is tuple:
        return bytes(record[ID]).decode("ascii", "replace")
    headers = read_headers(record)
    for name, value in headers if isinstance(headers, list) else ():
        if name == H_ID and isinstance(value, bytes):
            return value.decode("utf-8", "replace")
    return None


class WorkerMarkers:
    def __init__(
        self,
        worker: str,
        book: MarkerBook,
        gate: MarkerGate,
        levels: LevelSet,
        outcomes_topic: str,
        metrics: ServiceMetrics,
        now_ms: Callable[[], int],
        *,
        transactional: bool = False,
        cancel_lead_ms: int = 0,
    ) -> None:
        """`cancel_lead_ms`: a record due at D may go once every marker appended before
        D less this was read (`Settings.cancel_lead`): the reader's passes, which run
        every `IDLE_PASS_S` anyway, are then ahead of the due times, and a record does
        not wait on one in steady operation."""
        self.worker = worker
        self._lead_ms = cancel_lead_ms
        self._transactional = transactional
        self.book = book
        self.gate = gate
        self._levels = levels
        self._outcomes = outcomes_topic
        self._metrics = metrics
        self._now_ms = now_ms
        self.owned: dict[TP, int] = {}
        """Partition -> when it was assigned (epoch ms)."""
        self._open: list[tuple[Key | None, TP, Action]] = []
        self._deferred: list[tuple[Action, bytes, bytes]] = []
        """At-least-once: answers `moved` to write once their copy is durable, with the
        action that made it (answer value, key)."""
        self._failed_actions: list[Action] = []
        self._sender: MarkerSender | None = None
        self._scanned: dict[TP, tuple[int, set[bytes]]] = {}
        """Partition -> (offset through which its queue was searched, for which ids)."""
        self._arrivals: dict[TP, int] = {}
        """Per partition with parked markers: the last offset looked at for their messages."""
        self._read: dict[TP, tuple[int, int]] = {}
        """Partition -> (the latest append time of a run handed over since it was
        assigned, when that run was handed over): how far its reading got."""
        self._served_ms = -CHECK_MS
        """When the last serve pass ended (epoch ms)."""
        self._seen_change = -1
        self._begin: Callable[[], None] = lambda: None
        """Runs before a serve pass produces anything (exactly-once: begins the
        transaction)."""
        self.queue_of: Callable[[TP], deque[Any] | None] = lambda _tp: None
        self.due_of: Callable[[TP, Any], int] = lambda _tp, _r: 0
        self.wake: Callable[[], None] = lambda: None
        """Wakes the worker's forwarder (its partition group's `wake`)."""

    # -- the partition group's side ----------------------------------------------------
    def through_ms(self, partition: int | None = None) -> int:
        """Records (of level partition `partition`; None: of any) due up to this may be
        taken (negative: none may, the gate is shut)."""
        gate = self.gate
        through = gate.through_ms if partition is None else gate.through_for(partition)
        return through if through < 0 else through + self._lead_ms

    def want(
        self, group: int, due_ms: int, wake: Callable[[], None], partition: int | None = None
    ) -> None:
        self.gate.want(group, due_ms - self._lead_ms, wake, partition)

    def need(self, tp: TP, appended_ms: int) -> None:
        self.gate.need(tp, appended_ms)
        read = self._read.get(tp)
        self._read[tp] = (max(appended_ms, read[0] if read else appended_ms), self._now_ms())

    def progress(self, tp: TP, appended_ms: int) -> None:
        self.gate.progress(tp, appended_ms)

    def assigned(self, tp: TP) -> None:
        self.owned[tp] = self._now_ms()
        self._forget_reading(tp)
        self.book.touch()

    def released(self, tps: Iterable[TP]) -> None:
        tps = set(tps)
        for tp in tps:
            self.owned.pop(tp, None)
            self._forget_reading(tp)
        self.gate.release(tps)

    def _forget_reading(self, tp: TP) -> None:
        """The partition's queue starts over: what was searched of it, and the markers
        parked because their messages were not in it, are looked at afresh."""
        self._scanned.pop(tp, None)
        self._read.pop(tp, None)
        self._arrivals.pop(tp, None)
        self.book.unpark_all(tp)

    # -- the sender's side ---------------------------------------------------------------
    def screen(self, tp: TP, records: list[Any]) -> list[int] | None:
        """Positions of the records of a run that a marker may concern (None: none can)."""
        ids = self.book.watch.get(tp)
        if not ids:
            return None
        held = [i for i, r in enumerate(records) if type(r) is tuple and r[ID]]
        return [held[k] for k in ids.positions([records[i][ID] for i in held])]

    def has(self, message_id: str) -> bool:
        return self.book.has(message_id)

    def decide(
        self, tp: TP, record: Any, envelope: Envelope, due_ms: int, sender: MarkerSender
    ) -> int | None:
        """What to do with a record taken at its due time: None when it is withdrawn or
        moved (done here), else the due time to forward it with. Raises
        `SendLaterError` while the answers of the predecessor are still being read."""
        self._sender = sender
        message_id = envelope.id
        if not self._outcomes_known(tp) and self.book.has_reschedule(message_id):
            raise SendLaterError("reading which moves the partition's last owner made")
        found = self.book.verdict_for(message_id, cursor_of(record), due_ms)
        spot = (tp[0], tp[1], offset_of(record))
        action = Action()
        now = self._now_ms()
        if found.action == MOVE:
            assert found.marker is not None
            asked = found.marker.asked_due_ms or now
            if asked > now:
                copy = self._copy(tp, record, envelope, found.marker, now, sender)
                action.executed.append(found.marker.key)
                action.copies.append((message_id, copy))
                self._answer_all(found, action, sender, copy)
                sender.rerouted(spot, copy[0])
                self._note(spot, tp, action)
                return None
        self._answer_all(found, action, sender, None)
        forward_due: int | None = due_ms
        if found.action in (CANCEL_IT, CLOSED):
            sender.withdraw(spot, CANCELLED if found.action == CANCEL_IT else MOVED)
            if found.action == CANCEL_IT:
                action.final.append((message_id, CANCELLED))
            forward_due = None
        else:
            if found.action == MOVE and found.marker is not None:
                forward_due = found.marker.asked_due_ms  # its new time has come: now
            action.final.append((message_id, FORWARDED))
        self._note(spot, tp, action)
        return forward_due

    def _copy(
        self,
        tp: TP,
        record: Any,
        envelope: Envelope,
        marker: LevelMarker,
        now: int,
        sender: MarkerSender,
        on_failure: Callable[[Any, Any], None] | None = None,
    ) -> TP:
        """Re-publish `record` due at the marker's time, to the level that holds what is
        left; returns where the copy went. `on_failure`: the copy's own delivery report
        (a copy made apart from its original's send, whose failure no run holds)."""
        # Timed from now, not from `now`: a serve pass that began before the marker was
        # filed timed a move to just under the longest level past it, and a delay-ms
        # beyond every level is dead-lettered when due (`delay_out_of_range`). A clock
        # behind the broker's does the same: delay-ms is capped, delay-due-ms is not.
        now = max(now, self._now_ms())
        asked = marker.asked_due_ms or now
        remaining = max(1, asked - now)
        remaining = min(remaining, self._levels.max_delay_ms)  # delay-due-ms keeps the rest
        level = self._levels.select(remaining)
        count = sender.partition_count(level.topic)
        viewed = record_of(tp, record)
        partition = keyed_partition(envelope.partitioner, viewed.key(), count)
        if partition is None:
            partition = tp[1] % count
        extra = [(H_DELAY_MS, str(remaining).encode()), (H_DUE_MS, str(asked).encode())]
        extra.append((H_MOVED_BY, moved_by(marker)))
        self._begin()
        sender.republish(tp, viewed, level.topic, partition, extra, on_failure)
        return (level.topic, partition)

    def _answer_all(
        self, found: Verdict, action: Action, sender: MarkerSender, copy: TP | None
    ) -> None:
        """Answer what the verdict settles (a move: each reschedule `moved`, to the time
        of the last one, with where its copy went)."""
        moved_to = found.marker.asked_due_ms if found.marker is not None else None
        where = f"{copy[0]}:{copy[1]}" if copy is not None else None
        for marker, outcome in found.answers:
            if self.book.is_answered(marker.key):
                continue
            if outcome == MOVED:
                self._answer(
                    marker, outcome, action, sender, due_ms=moved_to, copy=where,
                    defer=where is not None and not self._transactional,
                )  # fmt: skip
            else:
                self._answer(marker, outcome, action, sender)

    def _answer(
        self,
        marker: LevelMarker,
        outcome: str,
        action: Action,
        sender: MarkerSender,
        *,
        due_ms: int | None = None,
        reason: str | None = None,
        copy: str | None = None,
        defer: bool = False,
    ) -> None:
        reply = MarkerReply(
            marker.kind, marker.message_id, outcome, due_ms, None, None, reason, copy
        )
        action.answers.append((marker.key, outcome))
        if defer:
            self._deferred.append((action, reply.encode(), marker.key))
            return
        self._begin()
        sender.answer(
            self._outcomes, reply.encode(), marker.key, functools.partial(self._failed, marker.key)
        )

    def _failed(self, key: bytes, error: Any, _message: Any) -> None:
        """An answer the broker refused (at-least-once): given again later."""
        if error is not None:
            self.book.take_back(Action(answers=[(key, "")]))

    def _copy_failed(self, action: Action, error: Any, _message: Any) -> None:
        """A copy made apart from its original's send was refused: the move is made
        again, and its deferred answer is not written."""
        if error is not None:
            self._failed_actions.append(action)
            self.book.take_back(action)
            self._scanned.clear()  # its message is searched for again

    def _note(self, spot: Key | None, tp: TP, action: Action) -> None:
        if action.answers or action.executed or action.final or action.copies:
            self.book.apply(action)
            self._open.append((spot, tp, action))

    def _outcomes_known(self, tp: TP) -> bool:
        assigned = self.owned.get(tp)
        return assigned is not None and self.gate.outcomes_through_ms >= assigned

    # -- serving: answers and early moves between sends ------------------------------------
    def waiting(self) -> bool:
        """Whether `serve` may have something to do (cheap: runs every pass)."""
        if not self.owned:
            return False
        now = self._now_ms()
        if self.book.version != self._seen_change:
            return now >= self._served_ms + SERVE_GAP_MS
        return now >= self._served_ms + CHECK_MS

    def nudge(self) -> None:
        """After a pass of the reader (its thread): wake the forwarder if it has markers
        to serve. A forwarder sleeps until its next record is due, or for good when it
        holds none, so without this a marker would wait for a record to fall due: an
        answer for a message queued far ahead, or one that is not there, would never
        come. Costs nothing while no marker names a partition it owns."""
        owned = self.owned.copy()
        if not owned:
            return
        if self.book.version == self._seen_change:
            if self._now_ms() < self._served_ms + CHECK_MS:
                return
            book = self.book
            if not any(book.has_unresolved(tp) or book.copies_on(tp) for tp in owned):
                return
        self.wake()

    def recall(self, tp: TP, record: Any) -> None:
        """A record that may be a copy a move made: the markers since the one that made
        it must be in memory before it is decided (it may have waited long), else they
        are read again first and the record waits (`SendLaterError`)."""
        cursor = cursor_of(record)
        if cursor is None:
            return
        self.gate.need(tp, cursor[0] + self.gate.lead_ms)
        if self.gate.rewind_asked() or self.gate.through_ms < 0:
            raise SendLaterError("reading the markers of a moved message again")

    def serve(self, sender: MarkerSender, begin: Callable[[], None] = lambda: None) -> None:
        self._begin = begin
        self._sender = sender
        self._seen_change = self.book.version
        now = self._now_ms()
        try:
            self._serve_owned(sender, now)
        finally:
            self._served_ms = self._now_ms()

    def _serve_owned(self, sender: MarkerSender, now: int) -> None:
        for tp in list(self.owned):
            if not self._outcomes_known(tp):
                continue
            self._unpark_arrivals(tp)
            entries = self.book.entries(tp, SERVE_BATCH, now)
            copies = self.book.copies_on(tp)
            if not entries and not copies:
                self._scanned.pop(tp, None)
                continue
            for entry in entries:
                if entry.refusal is not None:
                    outcome, reason = entry.refusal
                    self._serve_one(entry, outcome, sender, reason=reason)
            found = self._search(tp, [e for e in entries if e.refusal is None], copies)
            for message_id, record in found.items():
                self._early(tp, message_id, record, now, sender)
            parked = []
            for entry in entries:
                if entry.refusal is None and entry.marker.message_id not in found:
                    until = self._not_found(tp, entry, now, sender)
                    if until is not None:
                        parked.append((entry, until))
            if parked:
                self._arrivals.setdefault(tp, self._scanned.get(tp, (-1, set()))[0])
                for entry, final in self.book.park(tp, parked):
                    self._serve_final(entry, final, sender)

    def _unpark_arrivals(self, tp: TP) -> None:
        """Records read on `tp` since its markers were parked bring theirs back (a
        parked marker's message was not queued when it was searched for)."""
        if not self.book.parked_on(tp):
            self._arrivals.pop(tp, None)
            return
        through = self._arrivals.get(tp)
        queue = self.queue_of(tp)
        if through is None or not queue:
            return
        raw_ids = []
        last = through
        for record in reversed(queue):
            offset = offset_of(record)
            if offset <= through:
                break
            last = max(last, offset)
            message_id = id_of(record)
            if message_id is not None:
                raw_ids.append(message_id.encode())
        if raw_ids:
            self.book.unpark_named(tp, raw_ids)
        self._arrivals[tp] = last

    def _serve_one(
        self, entry: Entry, outcome: str, sender: MarkerSender, reason: str | None = None
    ) -> None:
        if self.book.is_answered(entry.marker.key):
            return
        action = Action()
        self._answer(entry.marker, outcome, action, sender, reason=reason)
        self._note(None, entry.tp, action)

    def _search(self, tp: TP, entries: list[Entry], copies: set[str]) -> dict[str, Any]:
        """The queued records of `tp` that these markers (or copies) may concern: a
        marker not searched for yet searches the whole queue once, then only records
        admitted since are looked at."""
        queue = self.queue_of(tp)
        if not queue:
            return {}
        through, searched = self._scanned.get(tp, (-1, set()))
        wanted = {e.marker.message_id for e in entries} | copies
        fresh = {e.marker.message_id for e in entries if e.marker.key not in searched}
        fresh |= {c for c in copies if c.encode() not in searched}
        found: dict[str, Any] = {}
        last = through
        for record in reversed(queue):
            offset = offset_of(record)
            last = max(last, offset)
            if offset <= through and not fresh:
                break
            message_id = id_of(record)
            if message_id in wanted and (offset > through or message_id in fresh):
                found.setdefault(message_id, record)
        keys = {e.marker.key for e in entries} | {c.encode() for c in copies}
        self._scanned[tp] = (last, keys)
        return found

    def _early(self, tp: TP, message_id: str, record: Any, now: int, sender: MarkerSender) -> None:
        """A marker's message is queued here: move it now, or answer what taking it will
        do (a cancel, a delivery after the marker came too late)."""
        due = self.due_of(tp, record)
        found = self.book.verdict_for(message_id, cursor_of(record), due)
        if found.action == CLOSED or (found.action == MOVE and due <= now):
            return  # moved already; or due now, and taking it decides the same at once
        marker = found.marker
        if (
            found.action == MOVE
            and marker is not None
            and not self.gate.read_before(tp[1], marker.appended_ms, marker.partition)
        ):
            self._scanned.pop(tp, None)  # searched for again on the next pass
            return  # a cancel before it may still be on another markers partition
        action = Action()
        copy = None
        if found.action == MOVE and marker is not None:
            envelope = sender.envelope_of(record_of(tp, record))
            if envelope is None:
                return  # no envelope to move it by: the full path dead-letters it when due
            failed = functools.partial(self._copy_failed, action)
            copy = self._copy(tp, record, envelope, marker, now, sender, failed)
            action.executed.append(marker.key)
            action.copies.append((message_id, copy))
        self._answer_all(found, action, sender, copy)
        self._note(None, tp, action)

    def _not_found(self, tp: TP, entry: Entry, now: int, sender: MarkerSender) -> int | None:
        """The message of a marker is not queued here: answer once it cannot come.
        Returns the time before which nothing can be decided, if that is all that
        holds it back (the marker is parked until then: `MarkerBook.park`)."""
        marker = entry.marker
        message_id = marker.message_id
        if message_id in self.book.copies:
            return None  # its copy's holder answers
        sent = entry.sent_ms
        bound = None if sent is None else sent + entry.delay_ms + LEAD_MS + SKEW_MS
        if bound is not None and marker.appended_ms < bound and now < bound:
            # A flood's marker: parked at one hold of the lock for all of them, which
            # passes over the answered and hands back those whose message is done.
            return bound
        if self.book.is_answered(marker.key):
            return None
        final = self.book.final.get(message_id)
        if final is not None:
            self._serve_final(entry, final, sender)
            return None
        if sent is None or bound is None:
            return None
        if marker.appended_ms >= bound and not self.book.has_reschedule(message_id):
            reason = "its message was due before the marker arrived: sent already"
            self._serve_one(entry, TOO_LATE, sender, reason=reason)
            return None
        if now < bound:
            return bound
        if not self._passed(tp, bound, entry.delay_ms, now):
            return None
        if marker.appended_ms < sent + entry.delay_ms - SKEW_MS:
            reason = f"no message with this id reached {tp[0]} partition {tp[1]}"
            self._serve_one(entry, UNMATCHED, sender, reason=reason)
        else:
            reason = "no message with this id was waiting: most likely sent before the marker"
            self._serve_one(entry, TOO_LATE, sender, reason=reason)
        return None

    def _serve_final(self, entry: Entry, final: str, sender: MarkerSender) -> None:
        """The marker's message is done for good: cancelled, or gone on without it."""
        self._serve_one(entry, CANCELLED if final == CANCELLED else TOO_LATE, sender)

    def _passed(self, tp: TP, bound: int, delay_ms: int, now: int) -> bool:
        """Whether the partition's reading is past `bound` (a due time): its head is due
        later, or a run appended after `bound` less the delay was handed over. With an
        empty queue and nothing read that far, only a partition that has handed over
        nothing for a while since it was assigned counts as idle: right after an
        assignment (a restart, a rebalance) or behind a backlog the consumer may not have
        handed over the records up to the message yet, and a message not read yet must
        not be answered as one that never came."""
        queue = self.queue_of(tp)
        if queue:
            return self.due_of(tp, queue[0]) > bound
        read = self._read.get(tp)
        if read is not None and read[0] > bound - delay_ms:
            return True
        quiet_since = max(self.owned.get(tp, now), read[1] if read is not None else 0)
        return now >= bound + EMPTY_GRACE_MS and now - quiet_since >= EMPTY_GRACE_MS

    # -- the open interval's listener ------------------------------------------------------
    def open(self) -> bool:
        return bool(self._open)

    def settled(self) -> None:
        """The interval committed: count its answers, and (at-least-once) write the
        answers of the moves whose copies it made durable, for the next commit point."""
        failed = self._failed_actions
        for _, _, action in self._open:
            if any(action is f for f in failed):
                continue
            for key, outcome in action.answers:
                entry = self.book.keys.get(key)
                level, kind = self._labels(entry)
                self._metrics.level_markers.labels(level, kind, outcome).inc()
        deferred = [d for d in self._deferred if not any(d[0] is f for f in failed)]
        tp_of = {id(action): tp for _, tp, action in self._open}
        self._open.clear()
        self._deferred.clear()
        self._failed_actions = []
        for action, value, key in deferred:
            if self._sender is None or id(action) not in tp_of:
                continue
            self._sender.answer(self._outcomes, value, key, functools.partial(self._failed, key))
            written = Action(answers=[a for a in action.answers if a[0] == key])
            self._open.append((None, tp_of[id(action)], written))

    def decided_on(self) -> dict[TP, int | None]:
        out: dict[TP, int | None] = {}
        for _, tp, _ in self._open:
            if tp not in out:
                queue = self.queue_of(tp)
                out[tp] = offset_of(queue[0]) if queue else None
        return out

    def _labels(self, entry: Entry | None) -> tuple[str, str]:
        if entry is None:
            return "-", "-"
        level = self._levels.by_topic(entry.tp[0]) if entry.refusal is None else None
        return (level.name if level is not None else "-"), entry.marker.kind

    def dropped(self, spots: set[Key] | None = None, tps: set[TP] | None = None) -> None:
        """The interval (or what it held of `spots`, or of `tps`) will not commit: what
        it decided is decided again."""
        kept = []
        for spot, tp, action in self._open:
            if (spots is not None and spot not in spots) or (tps is not None and tp not in tps):
                kept.append((spot, tp, action))
            else:
                self.book.take_back(action)
                self._deferred = [d for d in self._deferred if d[0] is not action]
                self._scanned.clear()  # what it decided is searched for again
        self._open = kept
