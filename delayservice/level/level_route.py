"""Level mode's decisions on the shared forward path: a record that asks for more than
its level is re-published where it fits, one that asks for less is counted, one whose
delay no level holds is dead-lettered, and the markers decide what their ids' records
become.

Apart from the sender because forward/ serves precise mode too and asks no mode
(`forward.send_route`). The markers carry their decisions out through here
(`level.markers.route.MarkerSender`), so that a copy, an answer, a withdrawal go into
the same open interval as the forwards.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Final

from confluent_kafka import KafkaException

from delayservice import partitioners
from delayservice.envelope import H_DELAY_MS, H_DUE_MS, Envelope, Headers, unwrap
from delayservice.errors import DelayServiceError, EnvelopeError
from delayservice.forward import dead_letter as dl
from delayservice.forward import speedups
from delayservice.forward.buffer import TP
from delayservice.forward.failures import Doom, Key
from delayservice.forward.held_record import HeldView, record_of
from delayservice.forward.send_errors import SendLaterError
from delayservice.forward.sender import RecordSender, Routes
from delayservice.kafka.record_headers import UNREADABLE, read_headers
from delayservice.level.markers.route import MarkerRoute, OnDelivery
from delayservice.levels import Level, LevelSet, format_duration_ms
from delayservice.log_throttle import Throttle
from delayservice.metrics.service_metrics import (
    ABOVE_LEVEL,
    BELOW_LEVEL,
    MISMATCH_KINDS,
    ServiceMetrics,
)

log = logging.getLogger(__name__)

UNREADABLE_DOOM: Final = Doom(dl.REASON_UNREADABLE_HEADERS, dl.UNREADABLE_HEADERS_DETAIL)


def level_routes(
    levels: LevelSet,
    precise_topic: str | None,
    dead_letter_topic: str,
    reserved: frozenset[str],
    markers: MarkerRoute | None = None,
) -> Routes:
    """A level forwarder's routes: a record re-published goes to `precise_topic` when
    there is one, else to the level of `levels` that holds what remains; `markers`: the
    worker's side of cancel and reschedule (None where markers are not read)."""
    mode = functools.partial(LevelRoute, levels, precise_topic, markers)
    return Routes(dead_letter_topic, reserved, mode)


class LevelRoute:
    """A level forwarder's route: owned by its sender, on the forwarder's thread."""

    def __init__(
        self,
        levels: LevelSet,
        precise_topic: str | None,
        markers: MarkerRoute | None,
        sender: RecordSender,
        metrics: ServiceMetrics,
    ) -> None:
        self._all = levels
        self._precise_topic = precise_topic
        self._markers = markers
        self._sender = sender
        self._levels = sender.levels
        self._previous = {
            topic: levels.previous_delay_ms(level) for topic, level in self._levels.items()
        }
        self._m_mismatch = {
            (topic, kind): metrics.level_mismatches.labels(level.name, kind)
            for topic, level in self._levels.items()
            for kind in MISMATCH_KINDS
        }
        self._throttle = Throttle()
        self._fast = speedups.fast_path()

    # -- how a due run goes out --------------------------------------------------------
    def send_run(self, tp: TP, records: list[Any]) -> int:
        """A `Held` record (its envelope read when it was admitted, `forward.held_record`)
        for a target known to exist is sent as it is, by `fast_path.send_held_run`:
        this runs once per forwarded record. Anything else (a record kept as the
        client's message, a record doomed or suspected by an earlier failure, one a
        marker may concern), and anything that goes wrong, takes `send_one`."""
        markers = self._markers
        if markers is not None:
            marked = markers.screen(tp, records)
            if marked:
                return self._send_screened(tp, records, marked)
        return self._send_plain(tp, records)

    def _send_plain(self, tp: TP, records: list[Any]) -> int:
        sender = self._sender
        failures = sender.failures
        return int(
            self._fast.send_held_run(
                tp,
                records,
                sender.producer.produce,
                sender.now_ms(),
                not failures.doomed and not failures.suspects,
                sender.lateness_of(tp[0]),
                sender.target_partitions,
                sender.produce_after_full,
                self.send_one,
                SendLaterError,
                partitioners.place,
            )
        )

    def _send_screened(self, tp: TP, records: list[Any], marked: list[int]) -> int:
        """`send_run` for a run where a marker may concern the records at `marked`: those
        take the full path (`send_one`, which asks the markers), the rest go as usual."""
        start = 0
        now_ms = self._sender.now_ms()
        for position in [*marked, len(records)]:
            if position > start:
                sent = self._send_plain(tp, records[start:position])
                if sent < position - start:
                    return start + sent
            if position == len(records):
                break
            try:
                self.send_one(tp, record_of(tp, records[position]), now_ms)
            except SendLaterError:
                return position
            start = position + 1
        return len(records)

    # -- the full path --------------------------------------------------------------------
    def send_one(self, tp: TP, record: Any, now_ms: int) -> None:
        """Everything but the common case, in order: an earlier failure's doom, headers
        that do not read, the envelope, the markers of its id, a delay no level holds and
        the target's checks (dead letters), a delay longer than the level (re-published),
        then the forward. Raises only `SendLaterError` (and `ForwarderFatalError`)."""
        sender = self._sender
        try:
            doom = sender.doom_of(tp, record)
            if doom is None and read_headers(record) is UNREADABLE:
                doom = UNREADABLE_DOOM
            if doom is not None:
                sender.dead_letter(tp, record, doom)
                return
            envelope, user = self._envelope(record)
            due = self._due_for(tp, record, envelope, sender.group.due_of(tp, record))
            if due is None:
                return  # a marker withdrew it, or moved it: nothing to forward
            level = self._levels[tp[0]]
            beyond = self._out_of_range(envelope, due, level)
            count, problem = sender.target_check(envelope, beyond)
            if problem is not None:
                sender.dead_letter(tp, record, Doom(*problem))
            elif not self._diverted(tp, record, envelope, due, level):
                sender.forward(tp, record, envelope, user, due, count, now_ms)
        except Exception as exc:
            sender.failed(tp, record, exc)

    def _envelope(self, record: Any) -> tuple[Envelope, Headers]:
        """Read here, when the record is due (a `Held` record's view rebuilds them)."""
        headers = read_headers(record)
        if type(headers) is not list:  # the client gives a list, or None
            headers = list(headers.items()) if isinstance(headers, dict) else None
        envelope, user, _ = unwrap(headers)
        return envelope, user

    def _due_for(self, tp: TP, record: Any, envelope: Envelope, due_ms: int) -> int | None:
        """The due time to forward `record` with, as its id's markers decide (None:
        withdrawn or moved); `due_ms` when no marker names it."""
        markers = self._markers
        if markers is None:
            return due_ms
        if type(record) is not HeldView:
            markers.recall(tp, record, envelope.id, due_ms)  # a copy: its markers at hand
        if not markers.has(envelope.id):
            return due_ms
        decided: int | None = markers.decide(tp, record, envelope, due_ms, self)
        return decided

    def _out_of_range(
        self, envelope: Envelope, due_ms: int, level: Level
    ) -> tuple[str, str] | None:
        """A delay longer than the longest level: no level may hold it (never early)."""
        longest = self._all.max_delay_ms
        base = due_ms - level.delay_ms
        if envelope.delay_ms > longest or (
            envelope.due_ms is not None and envelope.due_ms > base + longest
        ):
            return (
                dl.REASON_DELAY_OUT_OF_RANGE,
                f"delay-ms {envelope.delay_ms} / delay-due-ms {envelope.due_ms} is beyond "
                f"the longest delay held here ({format_duration_ms(longest)})",
            )
        return None

    def _diverted(self, tp: TP, record: Any, envelope: Envelope, due_ms: int, level: Level) -> bool:
        """Re-published when the envelope asks for more than the level (done here);
        counted when it asks for less than the level before it."""
        if envelope.delay_ms > level.delay_ms or (
            envelope.due_ms is not None and envelope.due_ms > due_ms
        ):
            self._reroute(tp, record, envelope, due_ms, level)
            return True
        if envelope.delay_ms <= self._previous[tp[0]]:
            self._mismatch(tp[0], BELOW_LEVEL)
        return False

    def _mismatch(self, topic: str, kind: str) -> None:
        self._m_mismatch[(topic, kind)].inc()
        if self._throttle.allow((topic, kind)) is not None:
            log.warning(
                "%s (level %s): envelopes %s; check that producers and daemons use the same "
                "levels (metric delayservice_level_mismatches_total)",
                topic,
                self._levels[topic].name,
                "belong to a shorter level; delivered late"
                if kind == BELOW_LEVEL
                else "ask for more than the level; re-published where they fit",
            )

    def _reroute(self, tp: TP, record: Any, envelope: Envelope, due: int, level: Level) -> None:
        """Re-publish a record whose envelope's floor is later than its level's due time,
        once, with its absolute due time, to where the rest of its wait fits: the
        precise topic (delay-ms 0, so the absolute due time alone decides: exact), or
        the smallest level that holds what remains (delay-ms is what remains: never
        early, late by at most the gap between two levels)."""
        base = due - level.delay_ms
        target_due = max(base + envelope.delay_ms, envelope.due_ms or 0, due)
        self._mismatch(tp[0], ABOVE_LEVEL)
        remaining = max(0, target_due - self._sender.now_ms())
        if self._precise_topic is not None:
            topic, delay_ms = self._precise_topic, 0
        else:
            topic, delay_ms = self._all.select(max(1, remaining)).topic, remaining
        extra = [(H_DELAY_MS, str(delay_ms).encode()), (H_DUE_MS, str(target_due).encode())]
        self.republish(tp, record, topic, None, extra)
        self._sender.interval.rerouted[(tp[0], tp[1], record.offset() or 0)] = topic

    # -- the markers: between runs, and what they do through the sender ----------------
    def waiting(self) -> bool:
        markers = self._markers
        return markers is not None and bool(markers.waiting())

    def serve(self, begin: Callable[[], None]) -> None:
        """Answer new markers and move their messages now, where they are queued here
        (`begin` runs before the first thing it produces). A failure leaves them for the
        next pass."""
        markers = self._markers
        if markers is None:
            return
        try:
            markers.serve(self, begin)
        except (SendLaterError, DelayServiceError, KafkaException) as exc:
            if self._throttle.allow("markers") is not None:
                log.warning("%s: markers wait: %s", self._sender.worker, exc)

    def republish(
        self,
        tp: TP,
        record: Any,
        topic: str,
        partition: int | None,
        extra: list[tuple[str, Any]],
        on_delivery: OnDelivery | None = None,
    ) -> None:
        """Produce `record` again to the delay topic `topic` (on `partition`, or where
        the producer puts it), its headers' `extra` names replaced by `extra`; a failure
        goes to `on_delivery` when given, else to the interval's failures."""
        raw = read_headers(record)
        names = {name for name, _ in extra}
        headers = [(n, v) for n, v in (raw if isinstance(raw, list) else []) if n not in names]
        headers.extend(extra)
        produce = self._sender.producer.produce
        if on_delivery is not None:
            produce = functools.partial(produce, on_delivery=on_delivery)
        self._sender.produce(produce, topic, record.value(), record.key(), headers, partition)

    def withdraw(self, spot: Key, outcome: str) -> None:
        """A marker withdrew this record: it goes nowhere, and its offset commits."""
        self._sender.interval.withdrawn[spot] = outcome

    def rerouted(self, spot: Key, topic: str) -> None:
        self._sender.interval.rerouted[spot] = topic

    def partition_count(self, topic: str) -> int:
        """The partition count of a topic (a level's), or `DelayServiceError`."""
        count = self._sender.targets.partitions(topic)
        if type(count) is not int:
            raise DelayServiceError(f"cannot place a copy on {topic}: {count}", retriable=True)
        return count

    def envelope_of(self, record: Any) -> Envelope | None:
        """A queued record's envelope, None when it has none that reads."""
        try:
            return self._envelope(record)[0]
        except (EnvelopeError, TypeError):
            return None

    def answer(self, topic: str, value: bytes, key: bytes, on_delivery: OnDelivery) -> None:
        """Produce an answer to a marker (in the open transaction, exactly-once)."""
        produce = functools.partial(self._sender.producer.produce, on_delivery=on_delivery)
        self._sender.produce(produce, topic, value, key, None, None)
