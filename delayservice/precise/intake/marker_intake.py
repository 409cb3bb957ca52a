"""Cancel and reschedule markers, as the intake reads them.

A marker is a record with no key or value whose headers ask something of a message
that may still be hours from due: `delay-cancel: <id>` to call it off,
`delay-reschedule: <id>` (with `delay-ms` or `delay-due-ms`) to move it. A marker
counts only on the partition its id names (`markers.precise_ids`), where alone the message can be.
A cancel is kept in the cancel log (`Wheel.cancel`); the batch's reschedules are
applied after its records are written (`Wheel.move_many`), so a message and its
reschedule may share a batch. Every outcome is answered (`markers.replies`) once it is
durable, and nothing a marker carries stops the intake.
"""

from __future__ import annotations

import logging
from typing import Final

from confluent_kafka import Message

from delayservice.envelope import Headers
from delayservice.log_throttle import Throttle
from delayservice.markers.precise_ids import names_elsewhere
from delayservice.markers.replies import CANCEL, RESCHEDULE, Answered, MarkerReply
from delayservice.markers.requests import (
    BadMarkerError,
    cancel_target,
    reschedule_request,
    reschedule_target,
)
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.precise.intake.offset_ledger import LevelLedger
from delayservice.precise.placement import Role
from delayservice.precise.storage.reschedule_log import RescheduleLog
from delayservice.precise.storage.slot_record import SlotRecord
from delayservice.precise.storage.storage_fault import StorageError
from delayservice.precise.wheel.reschedule_moves import READ_AGAIN, Reschedule
from delayservice.precise.wheel.wheel import Wheel

log = logging.getLogger(__name__)

CANCEL_GRACE_MS: Final = 60_000
"""A cancel is kept until max_delay after it was appended, plus this much for clocks."""


class MarkerIntake:
    """The markers of one intake's batches: what they ask, applied, and answered."""

    def __init__(
        self,
        topic: str,
        wheel: Wheel,
        reschedules: RescheduleLog,
        ledger: LevelLedger,
        roles: dict[int, Role],
        metrics: ServiceMetrics,
        *,
        far: bool,
        takeover_ms: int,
        max_delay_ms: int,
    ) -> None:
        self._topic = topic
        self._wheel = wheel
        self._reschedules = reschedules
        self._ledger = ledger
        self._roles = roles
        self._far = far
        self._takeover_ms = takeover_ms
        self._max_delay_ms = max_delay_ms
        self._m_cancels = metrics.precise_cancels
        self._m_reschedules = metrics.precise_reschedules
        self._throttle = Throttle()
        self._matched_at: list[tuple[int, int, str]] = []  # (partition, offset, cancel id)
        self._moves: list[Reschedule] = []  # this batch's reschedule markers
        self.answered: list[Answered] = []  # this batch's outcomes, to answer when durable

    def read(self, headers: Headers, message: Message, now_ms: int) -> bool:
        """Handle a record if it is a marker; False when it is not one."""
        cancel_id = cancel_target(headers)
        if cancel_id is not None:
            self._cancel(cancel_id, message, now_ms)
            return True
        return self._reschedule(headers, message, now_ms)

    def forget_from(self, firsts: dict[int, int]) -> None:
        """A batch read again from `firsts` (partition -> offset): what it noted goes."""
        self._matched_at = [m for m in self._matched_at if m[1] < firsts.get(m[0], m[1] + 1)]
        self._moves = []
        self.answered = []

    def cancelled_first(
        self, partition: int, offset: int, message_id: str, *, maybe_stored: bool = False
    ) -> bool:
        """A message whose cancel came before it: not stored. Its cancel is retired only
        once this offset is committed: a crash before would read the message again and
        must still find its cancel. A moved message is read again after a crash: its
        cancel stays for the copy the move wrote, which it calls off when it loads.
        `maybe_stored`: the message is read again (its offset is below where the intake
        began to write), and an earlier reading may have written it to its slot file
        before its cancel was read in the same batch, which never committed (a kill -9
        while the batch's replies waited, or a batch read again after a failure): the
        cancel stays, to call that copy off when its slot loads, or until it expires.
        Retired now, it would let the copy out."""
        if message_id in self._reschedules or maybe_stored:
            return True
        self._matched_at.append((partition, offset, message_id))
        self._m_cancels.labels("cancelled").inc()
        return True

    def retire_matched(self) -> None:
        """Drop the cancels whose messages' offsets are now committed."""
        waiting: list[tuple[int, int, str]] = []
        retired: list[str] = []
        for partition, offset, message_id in self._matched_at:
            committed = self._ledger.last_committed(partition)
            if committed is not None and committed > offset:
                retired.append(message_id)
            elif partition in self._ledger.partitions:
                waiting.append((partition, offset, message_id))
        self._matched_at = waiting
        self._wheel.retire_cancels(retired)

    def _reply(self, message: Message, kind: str, message_id: str, outcome: str,
               due_ms: int | None = None) -> None:  # fmt: skip
        """Note a marker's outcome, answered once the batch is durable (`answer`)."""
        reply = MarkerReply(kind, message_id, outcome, due_ms)
        self.answered.append(Answered(message.partition() or 0, message.offset() or 0, reply))

    def _cancel(self, message_id: str, message: Message, now_ms: int) -> None:
        if not message_id:
            if self._throttle.allow("cancel without id") is not None:
                log.warning("%s: cancel markers without an id are ignored", self._topic)
            self._m_cancels.labels("refused").inc()
            self._reply(message, CANCEL, message_id, "refused")
            return
        if names_elsewhere(message_id, message.partition() or 0, far=self._far):
            # Its message lives where its id names (`markers.precise_ids`): kept here,
            # the cancel could never match, and would take room for up to max_delay.
            self._m_cancels.labels("unmatched").inc()
            self._reply(message, CANCEL, message_id, "unmatched")
            return
        _, appended = message.timestamp()
        base = appended if appended > 0 else now_ms
        outcome = self._wheel.cancel(message_id, base + self._max_delay_ms + CANCEL_GRACE_MS)
        self._reply(message, CANCEL, message_id, "accepted" if outcome == "pending" else outcome)
        if outcome != "pending":
            self._m_cancels.labels(outcome).inc()
            if outcome == "refused" and self._throttle.allow("cancel log full") is not None:
                log.warning("%s: cancels refused: the cancel log is full", self._topic)

    def _reschedule(self, headers: Headers, message: Message, now_ms: int) -> bool:
        """Queue a reschedule marker's move for after the batch's writes; False when the
        record is not one."""
        try:
            request = reschedule_request(headers)
        except BadMarkerError as exc:
            if self._throttle.allow("bad reschedule") is not None:
                log.warning("%s: reschedule marker ignored: %s", self._topic, exc)
            self._m_reschedules.labels("refused").inc()
            self._reply(message, RESCHEDULE, reschedule_target(headers), "refused")
            return True
        if request is None:
            return False
        message_id, delay_ms, due_ms = request
        partition = message.partition() or 0
        if names_elsewhere(message_id, partition, far=self._far):
            self._m_reschedules.labels(
                "unmatched"
            ).inc()  # its message is not here (`markers.precise_ids`)
            self._reply(message, RESCHEDULE, message_id, "unmatched")
            return True
        _, appended = message.timestamp()
        base = appended if appended > 0 else now_ms
        asked = max(base + (delay_ms or 0), due_ms or 0)
        if asked > base + self._max_delay_ms:
            if self._throttle.allow("reschedule too far") is not None:
                log.warning(
                    "%s: reschedule of %s refused: %d ms ahead is beyond max_delay",
                    self._topic,
                    message_id,
                    asked - base,
                )
            self._m_reschedules.labels("refused").inc()
            self._reply(message, RESCHEDULE, message_id, "refused")
            return True
        # A time already past means now: `asked` is never before the marker's append
        # time, and a marker read again after a crash asks for the same instant, so
        # its copy lands where the first reading's did.
        due = asked
        replica = self._roles.get(partition) is Role.REPLICA
        fire_ms = due + (self._takeover_ms if replica else 0)
        offset = message.offset() or 0
        self._moves.append(Reschedule(message_id, partition, offset, due, replica, fire_ms))
        return True

    def apply_moves(self, in_memory: list[tuple[SlotRecord, float]]) -> None:
        """Apply the batch's reschedules; copies due in memory join `in_memory`. One
        that fails unexpectedly is counted refused and logged, and the rest go on."""
        moves, self._moves = self._moves, []
        if not moves:
            return
        try:
            results = self._wheel.move_many(moves)
        except (StorageError, OSError):
            raise
        except Exception:
            results = []
            for request in moves:
                try:
                    results.extend(self._wheel.move_many([request]))
                except (StorageError, OSError):
                    raise
                except Exception:
                    log.exception("%s: reschedule of %s failed", self._topic, request.message_id)
                    results.append(("refused", None))
        for request, (result, copy) in zip(moves, results, strict=True):
            log.debug("%s: reschedule of %s: %s", self._topic, request.message_id, result)
            outcome, due = result, (request.due_ms if result == "moved" else None)
            if result == READ_AGAIN:  # answered again: the first answer may be lost
                current = self._reschedules.current(request.message_id)
                if current is not None and current.version == request.version:
                    outcome, due = "moved", current.due_ms
                else:
                    outcome = "superseded"
            else:
                self._m_reschedules.labels(result).inc()
            answer = Answered(
                request.partition,
                request.version,
                MarkerReply(RESCHEDULE, request.message_id, outcome, due),
            )
            self.answered.append(answer)
            if copy is not None:
                in_memory.append((copy, request.fire_ms / 1000))
