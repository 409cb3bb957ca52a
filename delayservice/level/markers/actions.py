"""One level worker's side of cancel and reschedule: what its forwarder does with the
markers of the partitions it owns.

- Screening: a run taken from a partition some marker's id names is checked for those
  ids (a set lookup per record, only there); a record that matches takes the sender's
  full path, which asks `decide`.
- Deciding: the verdict (`verdict`) on the record as taken at its due time:
  withdraw it (cancelled, or moved before), move it (a copy, re-published to the level
  that holds what is left, with `delay-moved-by`), or forward it.
- Serving: between sends, the owner looks for each new marker's message in its queue
  and answers at once: `cancelled` (it will be withdrawn when taken, which decides the
  same), `too_late`, or it moves the message now (a copy; the original stays queued and
  is withdrawn when its turn comes). A marker whose message is not there is answered
  once the message could no longer arrive: `too_late` (sent before the marker) or
  `unmatched` (never there), by the time the id says it was sent.

Every answer goes to the outcomes topic through the worker's own producer, in the open
interval (`open_answers`, which keeps what was decided until the interval commits or
is dropped). What was searched of each queue is `search`'s. A new owner answers
and moves nothing of a partition until it has read the answers written before it took
the partition over (`outcomes_through_ms`): those say which moves its predecessor
carried out.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Final

from delayservice.envelope import H_DELAY_MS, H_DUE_MS, H_MOVED_BY, Envelope
from delayservice.forward.buffer import TP
from delayservice.forward.failures import Key
from delayservice.forward.held_record import ID, offset_of, record_of
from delayservice.forward.send_errors import SendLaterError
from delayservice.level.markers.book import FORWARDED, Action, MarkerBook
from delayservice.level.markers.entry import Entry
from delayservice.level.markers.gate import MarkerGate
from delayservice.level.markers.open_answers import OpenAnswers
from delayservice.level.markers.placing import UNMATCHED
from delayservice.level.markers.records import cursor_of, moved_by
from delayservice.level.markers.route import MarkerSender
from delayservice.level.markers.search import QueueSearch
from delayservice.level.markers.verdict import (
    CANCEL_IT,
    CLOSED,
    MOVE,
    MOVED,
    TOO_LATE,
    LevelMarker,
)
from delayservice.levels import LevelSet
from delayservice.markers.level_ids import tail_partition
from delayservice.markers.replies import CANCELLED
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.partitioners import keyed_partition

log = logging.getLogger(__name__)

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
SERVE_BATCH: Final = 2_000
"""The most markers of one partition a serve pass looks at (the next ones the next
time): a flood of markers waiting for an answer costs each pass of the forwarder a
batch, not the whole flood."""


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
        self.book = book
        self.gate = gate
        self._levels = levels
        self._now_ms = now_ms
        self.owned: dict[TP, int] = {}
        """Partition -> when it was assigned (epoch ms)."""
        self._search = QueueSearch(book)
        self._served_ms = -CHECK_MS
        """When the last serve pass ended (epoch ms)."""
        self._seen_change = -1
        self.queue_of: Callable[[TP], deque[Any] | None] = lambda _tp: None
        self.due_of: Callable[[TP, Any], int] = lambda _tp, _r: 0
        self.wake: Callable[[], None] = lambda: None
        """Wakes the worker's forwarder (its partition group's `wake`)."""
        self.answers = OpenAnswers(
            book, self._search, levels, outcomes_topic, metrics, transactional=transactional
        )
        """What was decided and answered in the open interval."""

    # -- the partition group's side ----------------------------------------------------
    def through_ms(self, partition: int | None = None) -> int:
        """Records (of level partition `partition`; None: of any) due up to this may be
        taken (negative: none may, the gate is shut). The gate vouches for the markers
        appended before its instant, not in it: a marker stamped with the millisecond a
        pass began may have come just after the pass asked where the topic ends, and
        one stamped exactly `cancel_lead` before a due time must be honoured."""
        gate = self.gate
        return self._led(gate.through_ms if partition is None else gate.through_for(partition))

    def _led(self, through: int) -> int:
        return through if through < 0 else through + self._lead_ms - 1

    def want(
        self, group: int, due_ms: int, wake: Callable[[], None], partition: int | None = None
    ) -> None:
        self.gate.want(group, due_ms - self._lead_ms + 1, wake, partition)

    def need(self, tp: TP, appended_ms: int) -> None:
        self.gate.need(tp, appended_ms)
        self._search.read(tp, appended_ms, self._now_ms())

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
        self._search.forget(tp)
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
        self.answers.sender = sender
        message_id = envelope.id
        if not self._outcomes_known(tp) and self.book.has_reschedule(message_id):
            raise SendLaterError("reading which moves the partition's last owner made")
        found = self.book.verdict_for(message_id, cursor_of(record), due_ms)
        spot = (tp[0], tp[1], offset_of(record))
        action = Action()
        now = self._now_ms()
        log.debug(
            "%s[%d]@%d %s due %d at %d: %s (%s)",
            *spot,
            message_id,
            due_ms,
            now,
            found.action,
            None if found.marker is None else found.marker.key,
        )
        if found.action == MOVE:
            assert found.marker is not None
            asked = found.marker.asked_due_ms or now
            if asked > now:
                copy = self._copy(tp, record, envelope, found.marker, now, sender)
                action.executed.append(found.marker.key)
                action.copies.append((message_id, copy))
                self.answers.answer_all(found, action, sender, copy)
                sender.rerouted(spot, copy[0])
                self.answers.note(spot, tp, action)
                return None
        self.answers.answer_all(found, action, sender, None)
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
        self.answers.note(spot, tp, action)
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
        self.answers.begin()
        sender.republish(tp, viewed, level.topic, partition, extra, on_failure)
        return (level.topic, partition)

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

    def recall(self, tp: TP, record: Any, message_id: str, due_ms: int) -> None:
        """A record that may be a copy a move made: the markers since the one that made
        it must be in memory before it is decided (it may have waited long), else they
        are read again first and the record waits (`SendLaterError`).

        A copy's markers are those of its id, on the markers partition of the level
        partition the id names, which need not be the partition the copy waits on (a
        level with another partition count, a key placed elsewhere): the take gated it
        on its own partition's, so it also waits here until its id's are read through
        its due time, as an original of that partition would."""
        cursor = cursor_of(record)
        if cursor is None:
            return
        self.gate.need(tp, cursor[0] + self.gate.lead_ms)
        if self.gate.rewind_asked() or self.gate.through_ms < 0:
            raise SendLaterError("reading the markers of a moved message again")
        named = tail_partition(message_id)
        if (
            named is not None
            and named != tp[1]
            and self._led(self.gate.through_named(named)) < due_ms
        ):
            self.want(id(self), due_ms, self.wake, named)
            raise SendLaterError("reading the markers of the partition its id names")

    def serve(self, sender: MarkerSender, begin: Callable[[], None] = lambda: None) -> None:
        self.answers.begin = begin
        self.answers.sender = sender
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
            self._search.unpark_arrivals(tp, self.queue_of(tp))
            entries = self.book.entries(tp, SERVE_BATCH, now)
            copies = self.book.copies_on(tp)
            if not entries and not copies:
                self._search.again(tp)
                continue
            for entry in entries:
                if entry.refusal is not None:
                    outcome, reason = entry.refusal
                    self._serve_one(entry, outcome, sender, reason=reason)
            unrefused = [e for e in entries if e.refusal is None]
            found = self._search.search(tp, self.queue_of(tp), unrefused, copies)
            for message_id, record in found.items():
                self._early(tp, message_id, record, now, sender)
            parked = []
            for entry in entries:
                if entry.refusal is None and entry.marker.message_id not in found:
                    until = self._not_found(tp, entry, now, sender)
                    if until is not None:
                        parked.append((entry, until))
            if parked:
                self._search.parked(tp)
                for entry, final in self.book.park(tp, parked):
                    self._serve_final(entry, final, sender)

    def _serve_one(
        self, entry: Entry, outcome: str, sender: MarkerSender, reason: str | None = None
    ) -> None:
        if self.book.is_answered(entry.marker.key):
            return
        action = Action()
        self.answers.answer(entry.marker, outcome, action, sender, reason=reason)
        self.answers.note(None, entry.tp, action)

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
            self._search.again(tp)  # searched for again on the next pass
            return  # a cancel before it may still be on another markers partition
        action = Action()
        copy = None
        log.debug(
            "%s[%d]@%d %s due %d, ahead at %d: %s (%s)",
            *tp,
            offset_of(record),
            message_id,
            due,
            now,
            found.action,
            None if marker is None else marker.key,
        )
        if found.action == MOVE and marker is not None:
            envelope = sender.envelope_of(record_of(tp, record))
            if envelope is None:
                return  # no envelope to move it by: the full path dead-letters it when due
            failed = functools.partial(self.answers.copy_failed, action)
            copy = self._copy(tp, record, envelope, marker, now, sender, failed)
            action.executed.append(marker.key)
            action.copies.append((message_id, copy))
        self.answers.answer_all(found, action, sender, copy)
        self.answers.note(None, tp, action)

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
        assigned = self.owned.get(tp, now)
        queue = self.queue_of(tp)
        if not self._search.passed(tp, queue, self.due_of, bound, entry.delay_ms, now, assigned):
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

    # -- the open interval's listener: what `answers` holds ----------------------------
    def open(self) -> bool:
        return self.answers.open()

    def settled(self) -> None:
        self.answers.settled()

    def decided_on(self) -> dict[TP, int | None]:
        """Where each partition decided about in the interval stands: its first record
        still queued (None: none is)."""
        out: dict[TP, int | None] = {}
        for tp in self.answers.partitions():
            queue = self.queue_of(tp)
            out[tp] = offset_of(queue[0]) if queue else None
        return out

    def dropped(self, spots: set[Key] | None = None, tps: set[TP] | None = None) -> None:
        self.answers.dropped(spots, tps)
