"""Replicas: both holders of a partition report what they settled, and each consults
the other's reports before sending what the other may have sent.

Each message of a partition is held by its owner and, with two replicas, by one more
member. Every holder reports per partition, on a compacted topic keyed by partition
and member: "every record with offset in [from, through) and due before `due_before`
is settled". `through` is its confirmed commit (all below it is on its disk or
settled), `due_before` comes from its earliest slot that still has a file (all due
before it is settled), and `from` is the first offset its current data directory
holds: a member whose disk was lost and replaced claims nothing that went with the
old one, and the reports of the old one stay valid for what it did send.

A replica's copy fires at its due time plus the takeover delay. By then the owner has
normally reported it, and the copy is dropped (cleaned); if not, the owner is gone or
far behind and the replica forwards it (takes over). An owner that comes back and
finds records overdue by more than the takeover delay sends only those its replica has
not reported, so a restart after a take-over does not send everything twice. The worst
case is a duplicate carrying its `delay-id`, never a loss. No liveness protocol is
needed: every copy is its own timer.

Exactly-once, each transaction also writes what it delivered to the same topic
(`delivery_log`); the reader takes the other holder's such records too, for the
partitions this member holds, and counts what they name as covered until a report of
that holder claims it. The owner and the replica forward a partition under the owner's
one transactional id (the replica with a second producer, `precise_worker`), so only
one of them can commit at a time, and after each fence the new holder waits until this
reader has read past the topic's end (`read_past`): it then knows everything the other
committed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from delayservice.kafka.client_seam import ConsumerClient, ProducerClient
from delayservice.kafka.ready_batch import ready_batch
from delayservice.precise.delivery.sent_records import (
    MAX_PARTITION,
    Dropped,
    decode_sent_record,
    sent_refusal,
)
from delayservice.precise.placement import Placement, Role

log = logging.getLogger(__name__)

REPORT_EVERY_S: Final = 1.0
FAR_FUTURE_MS: Final = 2**62
MAX_NAMED_PER_PARTITION: Final = 2_000_000
"""Offsets named delivered by the other holder and not yet claimed by its reports,
kept per partition at most: beyond this (forged records), more are not taken, which
can cost a duplicate, never a loss."""
KEPT_DIRECTORIES: Final = 8
"""Reports kept per partition, one per data directory of either holder; the one that
reached least far goes first."""


class Report(NamedTuple):
    partition: int
    member: int
    start: int
    through: int
    due_before: int


def parse_report(raw: bytes | None) -> Report | None:
    """A report from the progress topic, or None for anything malformed (never raises)."""
    try:
        data = json.loads(raw or b"")
        report = Report(
            int(data["partition"]),
            int(data["member"]),
            int(data["from"]),
            int(data["through"]),
            int(data["due_before"]),
        )
    except Exception:
        return None
    return report


def encode_report(report: Report) -> bytes:
    return json.dumps(
        {
            "partition": report.partition,
            "member": report.member,
            "from": report.start,
            "through": report.through,
            "due_before": report.due_before,
        }
    ).encode()


class Progress:
    def __init__(
        self,
        done_topic: str,
        placement: Placement,
        producer: ProducerClient,
        make_consumer: Callable[[dict[str, Any]], ConsumerClient],
        committed: Callable[[int], int | None],
        origin: Callable[[int], int | None],
        earliest_s: Callable[[], dict[int, int]],
        takeover_ms: int,
        roles: dict[int, Role],
        dropped: Callable[[str], None] | None = None,
        level_name: str = "exact",
    ) -> None:
        """`earliest_s`: per partition, the first second of its earliest file, in fire
        time (a replica's copies fire `takeover_ms` after their due time): every record
        due before it is settled. `roles`: this member's role per partition held, as
        the intake fills it. `dropped`: counts a record it does not take, by reason:
        `sent_refusal`'s, or `not_holder` (a member that does not hold the partition).
        `level_name` ends its thread's name, as the wheel's."""
        self._topic = done_topic
        self._placement = placement
        self._producer = producer
        self._make_consumer = make_consumer
        self._committed = committed
        self._origin = origin
        self._earliest_s = earliest_s
        self._takeover_ms = takeover_ms
        self._dropped = Dropped(done_topic, dropped)
        self._reports: dict[int, dict[tuple[int, int], Report]] = {}
        """partition -> (member, first offset of its data directory) -> latest report"""
        self._delivered: dict[int, dict[int, int]] = {}
        """partition -> offset -> a bound on its due time (ms, exclusive): named
        delivered by the other holder's transactions, not yet claimed by its reports."""
        self._lock = threading.Lock()
        self._position = -1
        """The reader's position on the done topic after its last batch."""
        self._moved = threading.Condition(threading.Lock())  # notified as it moves on
        self._sent: dict[int, Report] = {}
        self._next_report = 0.0
        self._roles = roles
        self._caught_up = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._read, name=f"precise-progress-{level_name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stopping.set()
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    # -- reporting -----------------------------------------------------------------
    def report(self) -> None:
        """Publish each held partition's progress, at most once a second, only when it
        moved. Called from the intake thread."""
        now = time.monotonic()
        if now < self._next_report:
            return
        self._next_report = now + REPORT_EVERY_S
        # `through` is read before the slots: see the module docstring.
        roles = self._roles
        throughs = {p: self._committed(p) for p in roles}
        earliest = self._earliest_s()
        for partition, through in throughs.items():
            start = self._origin(partition)
            if through is None or start is None:
                continue
            second = earliest.get(partition)
            due_before = FAR_FUTURE_MS
            if second is not None:  # a replica's copies fire the takeover delay after due
                due_before = second * 1000 - (
                    self._takeover_ms if roles[partition] is Role.REPLICA else 0
                )
            report = Report(partition, self._placement.member, start, through, due_before)
            if self._sent.get(partition) == report:
                continue
            key = f"{partition}:{report.member}".encode()
            self._producer.produce(self._topic, encode_report(report), key)
            self._sent[partition] = report

    # -- consulting ----------------------------------------------------------------
    def covers(self, partition: int, offset: int, due_ms: int) -> bool:
        """Whether the partition's other holder reported this record settled, by any of
        its data directories (one lost with its disk still vouches for what it sent),
        or a transaction of its named it delivered."""
        with self._lock:
            delivered = self._delivered.get(partition)
            if delivered and offset in delivered:
                return True
            return any(
                report.start <= offset < report.through and due_ms < report.due_before
                for report in self._reports.get(partition, {}).values()
            )

    def read_past(self, offset: int) -> bool:
        """Whether this reader has read the done topic up to `offset` (what committed
        before it is taken)."""
        return self._position >= offset

    def wait_read_past(self, offset: int, timeout_s: float) -> bool:
        """`read_past`, waiting for it up to `timeout_s`."""
        with self._moved:
            return self._moved.wait_for(lambda: self._position >= offset, timeout_s)

    def _advance(self, position: int) -> None:
        with self._moved:
            if position > self._position:
                self._position = position
                self._moved.notify_all()

    @property
    def named(self) -> int:
        """Offsets named delivered by the other holder, not yet claimed by its reports."""
        with self._lock:
            return sum(map(len, self._delivered.values()))

    @property
    def ready(self) -> bool:
        """Whether every report written before this process started has been read.
        Until then a copy that depends on the other holder's word is not judged."""
        return self._caught_up.is_set()

    def _read(self) -> None:
        try:
            # Only what committed transactions wrote: an aborted one delivered nothing.
            consumer = self._make_consumer({"isolation.level": "read_committed"})
            consumer.assign([TopicPartition(self._topic, 0, OFFSET_BEGINNING)])
        except Exception:
            log.exception("progress reader for %s could not start", self._topic)
            return
        end: int | None = None
        while not self._stopping.is_set():
            try:
                if end is None:
                    low, end = consumer.get_watermark_offsets(
                        TopicPartition(self._topic, 0), timeout=10.0
                    )
                    if end <= low:
                        self._advance(end)
                        self._caught_up.set()
                for message in ready_batch(consumer, 500, 0.5):
                    error = message.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            log.info("%s: %s", self._topic, error.str())
                        continue
                    try:
                        self._take(message.value(), message.key())
                    except Exception:  # one record must not cost the rest of the batch
                        log.exception("%s: skipped a progress record", self._topic)
                    if (message.offset() or 0) + 1 >= end:
                        self._caught_up.set()
                self._advance(consumer.position([TopicPartition(self._topic, 0)])[0].offset)
            except Exception:
                log.exception("progress reader for %s: unexpected error; continuing", self._topic)
                self._stopping.wait(1.0)
        try:
            consumer.close()
        except Exception:
            log.exception("closing the progress reader failed")

    def _take(self, value: str | bytes | None, record_key: str | bytes | None = None) -> None:
        raw = value.encode() if isinstance(value, str) else value
        if isinstance(record_key, bytes) and record_key.startswith(b"sent:"):
            self._take_sent(raw, record_key)
            return
        report = parse_report(raw)
        if report is None:
            self._dropped("malformed")
            return
        if report.member == self._placement.member:
            return  # this member's own
        if not 0 <= report.member < self._placement.members:
            self._dropped("unknown_member")
            return
        if not 0 <= report.partition < MAX_PARTITION:
            self._dropped("bad_slot")
            return
        if self._placement.holder(report.partition, report.member) is None:
            self._dropped("not_holder")
            return
        with self._lock:
            by_directory = self._reports.setdefault(report.partition, {})
            key = (report.member, report.start)
            previous = by_directory.get(key)
            if previous is None or report.through >= previous.through:
                by_directory[key] = report
            if len(by_directory) > KEPT_DIRECTORIES:
                del by_directory[min(by_directory, key=lambda k: by_directory[k].through)]
            delivered = self._delivered.get(report.partition)
            if delivered:  # what the report claims need not be named any more
                claimed = [
                    offset
                    for offset, due_bound in delivered.items()
                    if report.start <= offset < report.through and due_bound <= report.due_before
                ]
                for offset in claimed:
                    del delivered[offset]

    def _take_sent(self, raw: bytes | None, key: bytes) -> None:
        """A transaction's record of what it delivered: the other holder's, for the
        partitions this member holds, counts as covered."""
        record = decode_sent_record(raw)
        placement = self._placement
        refusal = sent_refusal(key, record, placement.members)
        if refusal is not None or record is None:
            self._dropped(refusal or "malformed")
            return
        if record.writer == placement.member:
            return  # this member's own
        with self._lock:
            for (partition, second), offsets in record.offsets.items():
                if placement.role(partition) is None:
                    continue  # not held here
                role = placement.holder(partition, record.writer)
                if role is None:
                    self._dropped("not_holder")
                    continue
                # The writer names its own slot: a replica's fires the takeover delay late.
                due_bound = (second + 1) * 1000 - (self._takeover_ms if role is Role.REPLICA else 0)
                delivered = self._delivered.setdefault(partition, {})
                if len(delivered) + len(offsets) > MAX_NAMED_PER_PARTITION:
                    log.warning(
                        "%s: more than %d offsets of partition %d named delivered and not "
                        "claimed; not taking more",
                        self._topic,
                        MAX_NAMED_PER_PARTITION,
                        partition,
                    )
                    continue
                for offset in offsets:
                    delivered[offset] = due_bound
