"""Admitting what the consumer read into the partitions' queues, under flow control.

This is the consumer thread's per-record path, and nothing a single record carries may
stop it: it only appends records (the forwarder reads their envelopes), and a batch
that an exception interrupted is read again from the first record of each partition
it had not admitted (`rewind_unadmitted`), never skipped; so is every partition
after a consume() that raised, which drops what it fetched.

Backpressure is per partition: a partition is paused near its mark, whatever its
level, so one level's backlog never stops reading of another; a record flow control
refuses pauses its partition and is read again later (a seek back to it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from itertools import groupby
from typing import Final

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaError, Message, TopicPartition
from prometheus_client import Counter

from delayservice.forward.buffer import TP
from delayservice.kafka.broker_clock import BrokerClock
from delayservice.kafka.client_errors import raised_by
from delayservice.kafka.consumer_keeper import ConsumerKeeper
from delayservice.level.flow_control import FlowControl
from delayservice.level.partition_group import RECORD_KEY_ALLOWANCE, PartitionGroup
from delayservice.level.partition_names import named, tp_of
from delayservice.level.reading_state import ReadingState

log = logging.getLogger(__name__)

_TOPIC: Final = Message.topic
_PARTITION: Final = Message.partition
_ERROR: Final = Message.error


class RecordAdmission:
    """One per consumer loop, used on its thread only."""

    def __init__(
        self,
        name: str,
        keeper: ConsumerKeeper,
        reading: ReadingState,
        group: PartitionGroup,
        flow: FlowControl,
        broker_clock: BrokerClock,
        consumed: dict[str, Counter],
        *,
        on_error: Callable[[KafkaError], None],
        on_records: Callable[[], None],
        loop_errors: Counter,
    ) -> None:
        """`consumed`: the count of records read, per level topic; `on_error`: the client's
        error events found in a batch; `on_records`: a batch held records (the broker
        answers)."""
        self._name = name
        self._keeper = keeper
        self._reading = reading
        self._group = group
        self._flow = flow
        self._broker_clock = broker_clock
        self._m_consumed = consumed
        self._on_error = on_error
        self._on_records = on_records
        self._m_loop_errors = loop_errors
        self._in_hand: list[Message] = []
        """The batch consume() last returned, until every partition of it is admitted."""
        self._admitted: set[TP] = set()
        """Partitions of `_in_hand` whose records were admitted (or set to be re-read)."""

    def admit_turn(self, messages: list[Message]) -> None:
        """One turn's reading: resume what was just assigned, admit the batch consume()
        returned, seek back what must be read again, resume what has drained."""
        self._in_hand = messages
        self._admitted.clear()
        reading = self._reading
        if reading.to_resume_on_assign:
            self._resume_fresh()
        if messages:
            self._admit(messages)
        if reading.rewind:
            self.apply_rewinds()
        self._resume_drained()

    def rewind_unadmitted(self) -> None:
        """The client has moved past every record it returned: a partition of the batch in
        hand not admitted when an iteration raised is read again from its first record
        there (`apply_rewinds`), never skipped. And past every record it fetched in a
        consume() that raised: confluent-kafka destroys that batch when a callback failed
        inside the call (`Consumer_consume`), so every other owned partition is read
        again from after the last record admitted (`ReadingState.next`). Where nothing
        was lost the seek goes where the client stands."""
        in_hand, self._in_hand = self._in_hand, []
        first: dict[TP, int] = {}
        for message in in_hand:
            if message.error() is None:
                first.setdefault(
                    (message.topic() or "", message.partition() or 0), message.offset() or 0
                )
        reading = self._reading
        rewind = reading.rewind
        for tp, offset in first.items():
            if tp in self._admitted or tp not in reading.owned:
                continue
            rewind[tp] = min(offset, rewind.get(tp, offset))
        for tp in reading.owned:
            if tp not in rewind and tp in reading.next:
                rewind[tp] = reading.next[tp]

    def _by_partition(self, messages: list[Message]) -> dict[TP, list[Message]]:
        """The batch's records per owned partition, in offset order; errors reported,
        records of a partition about to be sought back skipped (they are read again).

        No Python runs per record: the client returns each partition's records in
        chunks, which `groupby` cuts (by topic, then partition) and `extend` joins, in C."""
        if any(map(_ERROR, messages)):
            messages = self._without_errors(messages)
        runs: dict[TP, list[Message]] = {}
        topics: Iterable[tuple[str, Iterator[Message]]] = groupby(messages, _TOPIC)  # type: ignore[arg-type]
        for topic, of_topic in topics:
            chunks: Iterable[tuple[int, Iterator[Message]]] = groupby(of_topic, _PARTITION)  # type: ignore[arg-type]
            for partition, chunk in chunks:
                tp = (topic, partition)
                run = runs.get(tp)
                if run is None:
                    runs[tp] = list(chunk)
                else:
                    run.extend(chunk)
        rewind, owned = self._reading.rewind, self._reading.owned
        for tp in [tp for tp in runs if tp in rewind or tp not in owned]:
            run = runs.pop(tp)
            if tp in rewind:
                rewind.setdefault(tp, run[0].offset() or 0)
        return runs

    def _without_errors(self, messages: list[Message]) -> list[Message]:
        """The batch without the client's error events, which are reported."""
        kept = []
        for message in messages:
            error = message.error()
            if error is None:
                kept.append(message)
            elif error.code() != KafkaError._PARTITION_EOF:
                self._on_error(error)
        return kept

    def _admit(self, messages: list[Message]) -> None:
        self._admit_batch(messages)
        self._in_hand = []

    def _admit_batch(self, messages: list[Message]) -> None:
        """Append each partition's records to its queue, as many as flow control admits;
        the first refused record pauses its partition and is read again later."""
        read_ms = int(time.time() * 1000)  # after consume() returned: after every append
        paused, rewind = self._reading.paused, self._reading.rewind
        runs = self._by_partition(messages)
        if runs:
            self._on_records()
        group = self._group
        for tp, run in runs.items():
            take = self._flow.admit_many(
                group.counts.get(tp, 0), group.held[tp[0]], run, RECORD_KEY_ALLOWANCE
            )
            refused = take < len(run)
            if refused:
                if tp not in paused:
                    self._pause(tp)
                rewind[tp] = run[take].offset() or 0
                del run[take:]
            if run:
                self._reading.next[tp] = (run[-1].offset() or 0) + 1
                kind, stamp = run[-1].timestamp()  # the latest append: the tightest bound
                if kind == TIMESTAMP_LOG_APPEND_TIME:
                    self._broker_clock.observe(read_ms, stamp)
                size = sum(map(len, run)) + RECORD_KEY_ALLOWANCE * len(run)
                group.add(tp, run, size, read_ms)
                self._m_consumed[tp[0]].inc(len(run))
            self._admitted.add(tp)
            if not refused:
                self._pause_if_near(tp)

    def _pause_if_near(self, tp: TP) -> None:
        """Pause a partition near its mark, before a record is refused: that needs no seek
        back (the client resumes after the last record it delivered). Its own level's
        other partitions and every other level go on being read."""
        if tp not in self._reading.paused and self._group.counts.get(tp, 0) >= self._flow.pause_at:
            self._pause(tp)

    def _pause(self, tp: TP) -> None:
        self._keeper.client.pause([TopicPartition(*tp)])
        self._reading.paused.add(tp)
        self._reading.paused_since.setdefault(tp, time.monotonic())
        log.debug("%s[%d] paused", *tp)

    def apply_rewinds(self) -> None:
        """Seek each partition to be read again; one whose seek raises stays to be sought
        next time, and so do the ones after it."""
        rewind = self._reading.rewind
        for tp, offset in list(rewind.items()):
            if tp in self._reading.owned:
                self._keeper.client.seek(TopicPartition(tp[0], tp[1], offset))
                self._reading.next[tp] = offset
            del rewind[tp]

    def _resume_drained(self) -> None:
        reading = self._reading
        if not reading.paused:
            return
        counts = self._group.counts
        ready = [
            tp
            for tp in reading.paused
            if tp not in reading.owned or self._flow.may_resume(counts.get(tp, 0))
        ]
        if not ready:
            return
        live = [tp for tp in ready if tp in reading.owned]
        if live:
            self._keeper.client.resume([TopicPartition(*tp) for tp in live])
        for tp in ready:
            reading.paused.discard(tp)
            reading.paused_since.pop(tp, None)

    def _resume_fresh(self) -> None:
        """Resume what was just assigned: librdkafka keeps a partition's pause across
        re-assignment. Forgotten only once the resume went through: a resume that
        raised was tried again at no later turn, and the partition, paused by flow
        control before it was lost and assigned again, was never read again. A failed
        one waits for the next turn without holding up this one's batch."""
        reading = self._reading
        tps = [
            TopicPartition(*tp)
            for tp in reading.to_resume_on_assign
            if tp in reading.owned and tp not in reading.paused
        ]
        if tps:
            consumer = self._keeper.client
            failed = raised_by(lambda: consumer.resume(tps))  # a bare KafkaError too
            if failed is not None:
                self._m_loop_errors.inc()
                log.warning(
                    "%s: resuming %s failed (%s); trying again at the next turn",
                    self._name,
                    named(map(tp_of, tps)),
                    failed,
                )
                return
        reading.to_resume_on_assign.clear()
