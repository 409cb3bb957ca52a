"""Exactly-once in precise mode: each transaction says what it delivered.

A level's transaction carries the offsets of what it forwarded. The precise topic's
offsets commit when a record is on disk, long before it is due, so a precise forward's
transaction has none to carry; what must commit with the forward is the word that it
was delivered. A settled mark in a slot file can only be written once the transaction
has committed, and a kill -9 in between, or a commit whose outcome is unknown, leaves
a record delivered and unmarked. So every transaction also writes one record to the
topic's done topic, key `sent:{member}` (`sent_records`): per partition, the offsets of
the precise records it forwarded or dead-lettered (a copy a reschedule wrote carries
its marker's offset, so each copy is named apart; the reschedule log says which one is
live).

The forwarder writes a transaction's settled marks (to the page cache, which outlives
the process) before it begins the next one, so at any moment only the records of the
last transaction that committed can be delivered and unmarked, and the latest
`sent:{member}` record names them: the topic can be compacted. Records are named with
their slot (partition and second). Two kinds are carried into every later record until
they are settled: those whose marks could not be written (a storage fault), and those
learned delivered that have not come up yet (a slot still loading after a restart),
while their slot file is on disk.

The intake's dead letters (records without a valid envelope, never stored) are named
too, under second `DEAD_LETTERS`. Their "mark" is the intake's commit of their offsets,
which comes after the transaction, on the intake's thread: until it has come, a kill
makes the next process read them again. So they are carried into every later record
until the intake has committed past them, and one read again that a committed
transaction delivered is settled unsent.

After every init_transactions, which fences the member's previous producer and ends
its open transaction (committed or aborted), the forwarder `learn`s: it reads the done
topic read_committed to its end and takes this member's latest record. Records it
names are settled unsent when they come up (`sent`, asked by the wheel as it hands
records to the forwarder); nothing after it was delivered. A restart need not read
the whole topic (a compacted topic keeps its active segment whole, a record per
transaction): every `NOTE_EVERY_S`, between two transactions and once the marks of
every one before are written, the topic's end is noted beside the slot files
(`{data_dir}/{topic}.delivered`, in the page cache: `delivered_position`), and a
restart reads from there: any record it needs is later.

Replies to cancel and reschedule markers go in the same transactions (`answer`): a
reply is visible to a read_committed reader together with what the forwarder sent
before it, and the intake commits a marker's offset only once the transaction holding
its reply committed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from delayservice.forward.buffer import Runs
from delayservice.forward.send_errors import SendLaterError
from delayservice.kafka.client_seam import ConsumerClient
from delayservice.markers.replies import MarkerRepliesError
from delayservice.precise.delivery.delivered_position import read_position, write_position
from delayservice.precise.delivery.sent_records import (
    DEAD_LETTERS,
    Dropped,
    Slot,
    decode_sent_record,
    encode_sent,
    sent_key,
    sent_refusal,
)
from delayservice.precise.wheel.slot_ledger import SlotTracker

log = logging.getLogger(__name__)

READ_TIMEOUT_S: Final = 30.0
"""How long `learn` reads before it gives up for now (the forwarder tries again): a
transaction another member left open holds read_committed readers back until the broker
aborts it (the transaction timeout, 10 s)."""
REPLY_WAIT_S: Final = 30.0
"""How long the intake waits for the transaction holding its replies."""
STOP_WAIT_S: Final = 2.0
"""Once stopping, how long it still waits (the forwarder's last commit point)."""
NOTE_EVERY_S: Final = 10.0
LARGE_RECORD: Final = 900_000
"""A record above this size is logged: it nears the broker's default message limit."""


@dataclass
class _Replies:
    """Replies handed over by one call of `answer`, waiting for their transaction."""

    records: list[tuple[bytes, bytes]]
    done: threading.Event = field(default_factory=threading.Event)


class DeliveryLog:
    """The forwarder's `TransactionLedger` in precise mode, and the wheel's word on what
    was delivered before this process (or this producer) took over."""

    def __init__(
        self,
        done_topic: str,
        outcomes_topic: str,
        member: int,
        make_consumer: Callable[[dict[str, Any]], ConsumerClient],
        *,
        wake: Callable[[], None] = lambda: None,
        read_timeout_s: float = READ_TIMEOUT_S,
        reply_wait_s: float = REPLY_WAIT_S,
        position_file: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        slot_exists: Callable[[int, int], bool] = lambda _partition, _second: True,
        committed_past: Callable[[int, int], bool] = lambda _partition, _offset: False,
        writer: int | None = None,
        members: int | None = None,
        dropped: Callable[[str], None] | None = None,
    ) -> None:
        """`wake`: wakes the forwarder (replies are waiting for a transaction);
        `position_file`: where the done topic's offset a restart reads from is noted;
        `slot_exists`: whether a slot's file is still on disk; `committed_past`: whether
        the intake has committed its offset past a record (partition, offset), so its
        dead letter need not be named any more. `member`: whose
        transactional id the forwarder commits under; `writer`: who this is, when it is
        that member's replica taking over. `members`: how many precise members there
        are; `dropped`: counts a record under this log's key it does not take, by
        reason (`sent_refusal`)."""
        self._topic = done_topic
        self._outcomes = outcomes_topic
        self._member = member
        self._writer = member if writer is None else writer
        self._key = sent_key(member, writer)
        self._members = members
        self._dropped = Dropped(done_topic, dropped)
        self.others_read: Callable[[int, float], bool] | None = None
        """Two copies: waits, up to a timeout, until the reader of the other holder's
        records (`progress.Progress.wait_read_past`) has read the done topic up to an
        offset, and says whether it has. After each fence, `learn` waits for it to
        pass the end: what the other holder committed under this id before the fence
        is then known."""
        self._make_consumer = make_consumer
        self.wake = wake
        self._read_timeout = read_timeout_s
        self._reply_wait = reply_wait_s
        self._consumer: ConsumerClient | None = None
        self._read_from = 0
        """Where the reader was assigned from: its position says nothing (OFFSET_INVALID)
        until it has returned a record, and nothing comes when it starts at the end."""
        self._ends: ConsumerClient | None = None
        """Asks where the topic ends, read_uncommitted: a read_committed reader is told
        the last stable offset, which another member's open transaction holds back
        below this member's own records."""
        self._slot_exists = slot_exists
        self._committed_past = committed_past
        self._dead: dict[int, set[int]] = {}
        """partition -> offsets: the intake's dead letters committed transactions
        delivered, until the intake commits past them (forwarder's thread only)."""
        self._latest: dict[Slot, set[int]] = {}
        self._known: dict[int, dict[int, int]] = {}
        """partition -> offset -> second: learned delivered by committed transactions,
        not come up yet; settled unsent when they do."""
        self._unmarked: list[tuple[int, dict[Slot, set[int]]]] = []
        """Delivered by committed transactions, settled marks not yet known written:
        (the transaction's number, what it delivered) each. The marks are written by
        the wheel's marks writer (`marked`), the rest on the forwarder's thread."""
        self._commits = 0
        """Transactions committed so far (their number)."""
        self._note: tuple[int, int] | None = None
        """(end of the topic, transactions committed when it was read): noted once the
        marks of all those transactions are written."""
        self._in_txn: dict[Slot, set[int]] = {}
        self._lock = threading.Lock()
        self._replies: list[_Replies] = []
        self._replies_in_txn: list[_Replies] = []
        self._failed: list[str] = []
        self._stop_at: float | None = None
        self._position_file = position_file
        self._clock = clock
        self._noted_at = clock()
        self.learned = False
        """Whether it has learned once since it started (readiness waits for it)."""
        self.learned_records = 0
        """How many records the last `learn` found delivered."""

    # -- the wheel's side ------------------------------------------------------------
    def sent(self, partition: int, offset: int) -> bool:
        """Whether a committed transaction delivered this record (learned after the last
        fence): it is settled, not sent again (and no longer carried). Asked on the
        forwarder's thread, which settles it before its next commit."""
        known = self._known.get(partition)
        if not known or offset not in known:
            return False
        del known[offset]
        return True

    @property
    def known(self) -> int:
        """Records learned delivered that have not come up yet."""
        return sum(map(len, self._known.values()))

    # -- the intake's side -------------------------------------------------------------
    def answer(self, records: list[tuple[bytes, bytes]]) -> None:
        """Hand replies (key, value) to the forwarder's next transaction and wait until it
        committed; raises `MarkerRepliesError` when it did not in time (the intake reads
        the markers again and answers them again)."""
        if not records:
            return
        replies = _Replies(records)
        with self._lock:
            self._replies.append(replies)
        self.wake()
        started = time.monotonic()
        while not replies.done.wait(0.05):
            now = time.monotonic()
            stop_at = self._stop_at
            stopped = stop_at is not None and now - stop_at >= STOP_WAIT_S
            if now - started < self._reply_wait and not stopped:
                continue
            with self._lock:
                if replies in self._replies:
                    self._replies.remove(replies)
            raise MarkerRepliesError(
                f"replies on {self._outcomes}: no transaction committed them in "
                f"{now - started:.0f} s",
                retriable=True,
            )

    def stopping(self) -> None:
        """The daemon stops: replies wait only for the forwarder's last commit point."""
        self._stop_at = time.monotonic()

    # -- the forwarder's side (TransactionLedger) ------------------------------------
    def pending(self) -> bool:
        return bool(self._replies)

    def write(self, producer: Any, runs: Runs) -> None:
        """Produce this transaction's `sent` record (with marks still unwritten from
        before) and the replies waiting, inside the open transaction."""
        delivered: dict[Slot, set[int]] = {}
        with self._lock:
            unmarked = [chunk for _, chunk in self._unmarked]
        for chunk in unmarked:
            for slot, offsets in chunk.items():
                delivered.setdefault(slot, set()).update(offsets)
        for _, records in runs:
            for record in records:
                slot = record.slot
                if type(slot) is SlotTracker:
                    delivered.setdefault((slot.partition, slot.second), set()).add(record.offset())
                elif slot is not None:  # a dead letter of the intake
                    delivered.setdefault((record.partition(), DEAD_LETTERS), set()).add(
                        record.offset()
                    )
        for partition, offsets in self._dead_uncommitted().items():
            delivered.setdefault((partition, DEAD_LETTERS), set()).update(offsets)
        for (partition, second), offsets in self._still_known().items():
            delivered.setdefault((partition, second), set()).update(offsets)
        self._in_txn = delivered
        with self._lock:
            self._replies_in_txn = list(self._replies)
        if delivered:
            value = encode_sent(self._member, delivered, self._writer)
            if len(value) > LARGE_RECORD:
                log.warning(
                    "%s: a transaction's delivery record is %d bytes (%d records); a smaller "
                    "commit_interval_s keeps it below the broker's message limit",
                    self._topic,
                    len(value),
                    sum(map(len, delivered.values())),
                )
            producer.produce(self._topic, value, self._key, on_delivery=self._report)
        for replies in self._replies_in_txn:
            for key, reply in replies.records:
                producer.produce(self._outcomes, reply, key, on_delivery=self._report)

    def _still_known(self) -> dict[Slot, set[int]]:
        """What was learned delivered and has not come up yet, where its slot file is
        still on disk (a file gone took its records with it), or, for a dead letter,
        while the intake has not committed past it."""
        by_slot: dict[Slot, set[int]] = {}
        for partition, offsets in self._known.items():
            for offset, second in list(offsets.items()):
                if second == DEAD_LETTERS and self._committed_past(partition, offset):
                    del offsets[offset]
                    continue
                by_slot.setdefault((partition, second), set()).add(offset)
        gone = [slot for slot in by_slot if slot[1] != DEAD_LETTERS and not self._exists(slot)]
        for partition, second in gone:
            known = self._known[partition]
            for offset in by_slot.pop((partition, second)):
                del known[offset]
        return by_slot

    def _dead_uncommitted(self) -> dict[int, set[int]]:
        """The dead letters delivered whose offsets the intake has not committed yet."""
        for partition, offsets in list(self._dead.items()):
            offsets.difference_update(
                {offset for offset in offsets if self._committed_past(partition, offset)}
            )
            if not offsets:
                del self._dead[partition]
        return self._dead

    def _exists(self, slot: Slot) -> bool:
        try:
            return self._slot_exists(*slot)
        except Exception:  # a closed store (stopping): keep naming it
            return True

    def committed(self) -> None:
        for (partition, second), offsets in self._in_txn.items():
            if second == DEAD_LETTERS:
                self._dead.setdefault(partition, set()).update(offsets)
        with self._lock:
            self._commits += 1
            if self._in_txn:
                self._unmarked.append((self._commits, self._in_txn))
        self._in_txn = {}
        with self._lock:
            done, self._replies_in_txn = self._replies_in_txn, []
            self._replies = [r for r in self._replies if r not in done]
        for replies in done:
            replies.done.set()

    @property
    def commits(self) -> int:
        """Transactions committed so far: `marked` takes this, read when they settle."""
        with self._lock:
            return self._commits

    def marked(self, through: int) -> None:
        """The settled marks of the transactions up to number `through` are written
        (called by the wheel's marks writer): they need not be carried any more, and an
        end read after them may be noted."""
        with self._lock:
            self._unmarked = [chunk for chunk in self._unmarked if chunk[0] > through]
            note, self._note = self._note, None
            if note is not None and note[1] > through:
                self._note, note = note, None
        if note is not None:
            self._write_position(note[0])

    def note_position(self) -> None:
        """On the forwarder's thread, between two transactions, now and then: read where
        the done topic ends, and note it (no record before it is needed again) once
        the marks of every transaction committed so far are written."""
        if self._position_file is None or self._clock() - self._noted_at < NOTE_EVERY_S:
            return
        if any(self._known.values()) or self._dead_uncommitted():
            return  # records still carried: a restart must find the record naming them
        self._noted_at = self._clock()
        ends = self._ends
        if ends is None:
            return
        try:
            _, end = ends.get_watermark_offsets(
                TopicPartition(self._topic, 0), timeout=1.0, cached=False
            )
        except Exception as exc:  # only a longer read at the next start
            log.debug("%s: end not read: %s", self._topic, exc)
            return
        with self._lock:
            if self._unmarked:
                self._note = (end, self._commits)
                return
        self._write_position(end)

    def _write_position(self, end: int) -> None:
        if self._position_file is None:
            return
        try:
            write_position(self._position_file, end)
        except Exception as exc:  # only a longer read at the next start
            log.debug("%s: end not noted: %s", self._topic, exc)

    def learn(self) -> None:
        """Read the done topic read_committed to its end; what this member's latest
        record names was delivered and is settled unsent when it comes up."""
        with self._lock:
            self._note = None  # read before what this learns: no longer safe to note
        started = time.monotonic()
        try:
            if self._ends is None:
                self._ends = self._make_consumer({"isolation.level": "read_uncommitted"})
            _, end = self._ends.get_watermark_offsets(
                TopicPartition(self._topic, 0), timeout=10.0, cached=False
            )
            consumer = self._consumer
            if consumer is None:
                start = read_position(self._position_file) if not self.learned else None
                if start is None or start > end:  # none noted, or the topic made again
                    start = OFFSET_BEGINNING
                # Only what committed transactions wrote: an aborted one delivered nothing.
                consumer = self._consumer = self._make_consumer(
                    {"isolation.level": "read_committed"}
                )
                consumer.assign([TopicPartition(self._topic, 0, start)])
                self._read_from = max(0, start)
            self._read_to_end(consumer, end, started + self._read_timeout)
            self._others_read_to(end, started + self._read_timeout)
        except SendLaterError:
            raise
        except Exception as exc:
            self._close()  # a fresh reader next time, from the beginning
            raise SendLaterError(f"reading {self._topic}: {exc}") from exc
        for (partition, second), offsets in self._latest.items():
            known = self._known.setdefault(partition, {})
            for offset in offsets:
                known[offset] = second
        self.learned = True
        self.learned_records = sum(map(len, self._latest.values()))
        log.info(
            "%s: %d records delivered before this producer took over (%.2f s to read)",
            self._topic,
            self.learned_records,
            time.monotonic() - started,
        )

    def end(self) -> int:
        """Where the done topic ends now (read_uncommitted). Raises as the client does."""
        if self._ends is None:
            self._ends = self._make_consumer({"isolation.level": "read_uncommitted"})
        _, end = self._ends.get_watermark_offsets(
            TopicPartition(self._topic, 0), timeout=5.0, cached=False
        )
        return int(end)

    def _others_read_to(self, end: int, deadline: float) -> None:
        others_read = self.others_read
        if others_read is None:
            return
        if not others_read(end, max(0.0, deadline - time.monotonic())):
            raise SendLaterError(
                f"{self._topic}: the other holder's records not read to {end} in "
                f"{self._read_timeout:.0f} s"
            )

    def close(self) -> None:
        self._close()

    def _close(self) -> None:
        consumers = (self._consumer, self._ends)
        self._consumer = self._ends = None
        self._latest = {}
        for consumer in consumers:
            if consumer is not None:
                try:
                    consumer.close()
                except Exception:
                    log.exception("closing a reader of %s failed", self._topic)

    def _read_to_end(self, consumer: ConsumerClient, end: int, deadline: float) -> None:
        """Read on until the position passes `end` (it steps over transaction markers,
        which are never returned), taking this member's latest record."""
        tp = TopicPartition(self._topic, 0)
        while True:
            position = max(self._read_from, consumer.position([tp])[0].offset)
            if position >= end:
                return
            if time.monotonic() >= deadline:
                raise SendLaterError(
                    f"{self._topic} not read to its end ({end}) in {self._read_timeout:.0f} s"
                )
            for message in consumer.consume(500, 0.2):
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        log.info("%s: %s", self._topic, error.str())
                    continue
                if message.key() != self._key:
                    continue
                record = decode_sent_record(message.value())
                refusal = sent_refusal(message.key(), record, self._members)
                if refusal is not None:
                    self._dropped(refusal)
                elif record is not None:
                    self._latest = record.offsets

    def _report(self, error: Any, _message: Any) -> None:
        """A failed delivery of a record written here: the transaction is then
        abortable and does not commit, and everything in it goes again."""
        if error is not None:
            self._failed.append(error.str() if hasattr(error, "str") else str(error))
            log.warning("%s: a transaction's record was refused: %s", self._topic, self._failed[-1])
