"""The intake thread: reads the precise topic and writes each record into its slot file.

Durability comes before the commit: a batch is appended to its slot files, the files
are synced, and only then are the batch's offsets committed (asynchronously: the
broker's answer comes back through a later read), so a kill -9 at any moment either
leaves a record on disk or leaves it uncommitted, to be read again. Each commit's
offsets are also written beside the slot files (`intake_offsets`), and a restart reads
each partition from the later of those and the broker's: a record is read again only
when its batch was not yet committed here, however far the broker's offset lags. A
record read twice is written twice and held once (a slot holds each offset once: see
`slot_index` and `slot_ledger.FileOffsets`). Only then do records of in-memory slots
join the forwarder's buffer.

Which partitions it reads, and from where, is kept by `partition_reading`; what each
record carries decides its fate (`record_intake`), and nothing it carries stops this
thread.

A fault of the disk is not a record's: a full disk, a failed write or fsync, or a data
directory gone (`storage_fault`) stops this thread and the daemon through `on_fatal`,
with nothing dead-lettered and nothing committed past what is durable, so every record
not yet synced is read again after the restart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition

from delayservice.kafka.client_errors import STARTING_CODES
from delayservice.kafka.client_seam import ConsumerClient
from delayservice.kafka.consumer_keeper import ConsumerKeeper, unread_records
from delayservice.kafka.consumer_thread import ERROR_PAUSE_S, ConsumerThread
from delayservice.kafka.log_levels import GraceStreaks
from delayservice.kafka.ready_batch import ready_batch
from delayservice.markers.replies import (
    Answered,
    MarkerRepliesError,
)
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.precise.intake.admission import Admission
from delayservice.precise.intake.marker_intake import MarkerIntake
from delayservice.precise.intake.offset_ledger import LevelLedger, PartitionLedger
from delayservice.precise.intake.partition_reading import PartitionReading
from delayservice.precise.intake.record_intake import RecordIntake
from delayservice.precise.placement import Placement, Role
from delayservice.precise.storage.cancel_log import CancelLog
from delayservice.precise.storage.intake_offsets import IntakeOffsets
from delayservice.precise.storage.reschedule_log import RescheduleLog
from delayservice.precise.storage.slot_record import SlotRecord
from delayservice.precise.storage.slot_store import SlotStore
from delayservice.precise.storage.storage_fault import StorageError
from delayservice.precise.wheel.read_through import ReadThroughRounds
from delayservice.precise.wheel.wheel import Wheel

log = logging.getLogger(__name__)

BATCH: Final = 10_000
"""Records handled at most per sync and commit: a sync waits for the disk, so fewer and
larger batches keep the intake reading (what is queued is taken at once, so a quiet
topic's batches stay small and nothing waits for a batch to fill)."""
POLL_TIMEOUT_S: Final = 0.2
METADATA_EVERY_S: Final = 10.0
"""How often the partition count is read: partitions added to the precise topic are
read within this long."""
LAG_EVERY_S: Final = 5.0

MakeConsumer = Callable[[dict[str, Any]], ConsumerClient]

_PASSING_CODES: Final = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError._WAIT_COORD,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
    }
)


def _passing(error: KafkaError) -> bool:
    """Errors that go away by themselves (a coordinator moving or loading, a broker
    away); librdkafka does not flag all of them retriable when an offset fetch fails."""
    return bool(error.retriable()) or error.code() in _PASSING_CODES


class _Times:
    """When the intake next reads the partition count and the lag."""

    __slots__ = ("lag", "metadata")

    def __init__(self) -> None:
        self.metadata = 0.0
        self.lag = 0.0


class Intake(ConsumerThread):
    def __init__(
        self,
        topic: str,
        make_consumer: MakeConsumer,
        wheel: Wheel,
        store: SlotStore,
        cancels: CancelLog,
        reschedules: RescheduleLog,
        ledger: LevelLedger,
        admission: Admission,
        dead_letter: Callable[[SlotRecord], None],
        placement: Placement,
        metrics: ServiceMetrics,
        *,
        intake_offsets: IntakeOffsets,
        level_name: str,
        takeover_ms: int,
        max_delay_ms: int,
        on_fatal: Callable[[str], None],
        after_batch: Callable[[], None] = lambda: None,
        on_caught_up: Callable[[], None] = lambda: None,
        check_storage: Callable[[], None] = lambda: None,
        answer: Callable[[list[Answered]], None] = lambda _answered: None,
        roles: dict[int, Role] | None = None,
        far: bool = False,
        read_through: ReadThroughRounds | None = None,
    ) -> None:
        """`dead_letter` hands a record to the forwarder to dead-letter; it settles the
        record's offset in `ledger` once that is durable. `after_batch` runs on this
        thread after every iteration (progress reports); `on_caught_up` once, when
        `caught_up` is set.
        `check_storage` runs after each sync, before the commit, and raises
        `StorageError` when the data directory is no longer the one written to.
        `answer` gets each batch's marker outcomes once they are durable, and raises
        unless it made them durable too (the batch is then read again). `roles` is
        filled with this member's role per partition as partitions are assigned (pass
        a dict to share it). `far`: this intake reads the far topic, whose ids say
        so (`markers.precise_ids`). `intake_offsets` keeps, beside the slot files, how far each
        partition was read and written. `read_through` is told after each batch how
        far each partition has been read (what the wheel may hand out)."""
        self.topic = topic
        super().__init__(
            f"intake of {topic}",
            f"precise-intake-{level_name}",
            on_fatal,
            loop_errors=metrics.loop_errors.labels(level_name, "intake"),
            commits=metrics.commits.labels(level_name),
            commit_failures=metrics.commit_failures.labels(level_name),
        )
        self._make_consumer = make_consumer
        self._keeper: ConsumerKeeper | None = None  # made on this intake's thread
        self._wheel = wheel
        self._store = store
        self._cancels = cancels
        self._reschedules = reschedules
        self._offsets = intake_offsets
        self.ledger = ledger
        self.after_batch = after_batch
        self._check_storage = check_storage
        self._answer = answer
        self.roles: dict[int, Role] = {} if roles is None else roles
        self._partitions = PartitionReading(
            topic,
            placement,
            ledger,
            store,
            wheel,
            self.roles,
            metrics,
            intake_offsets=intake_offsets,
            level_name=level_name,
            on_caught_up=on_caught_up,
        )
        self._markers = MarkerIntake(
            topic,
            wheel,
            reschedules,
            ledger,
            self.roles,
            metrics,
            far=far,
            takeover_ms=takeover_ms,
            max_delay_ms=max_delay_ms,
        )
        self._records = RecordIntake(
            topic,
            wheel,
            cancels,
            admission,
            dead_letter,
            self._markers,
            self.roles,
            intake_offsets=intake_offsets,
            takeover_ms=takeover_ms,
        )
        self._unsettled: dict[int, int] | None = None
        """partition -> first offset of the batch being handled, until it is settled."""
        self._batch_ends: dict[PartitionLedger, int] = {}  # the next offset after it
        self._asked: dict[int, int] = {}  # partition -> offset committed, not yet answered
        self._starting = GraceStreaks()
        self._m_consumed = metrics.consumed.labels(level_name)
        self._m_lag = metrics.consumer_lag.labels(level_name)
        self.assigned = self._partitions.assigned
        self.caught_up = self._partitions.caught_up
        """Every record the precise topic held when the intake started is on disk or in
        memory (`PartitionReading.caught_up`)."""
        self._read_through = read_through
        self._times = _Times()

    @property
    def records_left(self) -> int:
        """Until `caught_up`, how many records the intake has still to read."""
        return self._partitions.records_left

    # -- lifecycle -----------------------------------------------------------------
    @property
    def _consumer(self) -> ConsumerClient | None:
        return None if self._keeper is None else self._keeper.client

    def _kept(self) -> ConsumerKeeper | None:
        return self._keeper

    # -- the loop ------------------------------------------------------------------
    def _open(self) -> ConsumerKeeper:
        self._keeper = ConsumerKeeper(
            self.topic, self._make_consumer, self.on_error, self.on_commit, self._on_fatal
        )
        return self._keeper

    def _replaced(self) -> None:
        self._partitions.replaced()  # the new client reads from where this left
        self._asked.clear()  # the old client's answers will not come
        self._times.metadata = 0.0

    def _recover(self) -> None:
        self._rewind()

    def _unexpected(self, exc: Exception) -> bool:
        """The broker away while markers are answered: read the batch again. A fault
        of the disk stops the thread (`_storage_fault`); anything else is survived."""
        if isinstance(exc, MarkerRepliesError):
            if self._throttle.allow("replies") is not None:
                log.warning("intake of %s: %s; reading the batch again", self.topic, exc)
            self._rewind()
            self._stopping.wait(ERROR_PAUSE_S)
            return True
        if isinstance(exc, (StorageError, OSError)):
            self._storage_fault(exc)
            return False
        return super()._unexpected(exc)

    def _iteration(self) -> None:
        times = self._times
        consumer = self._consumer
        assert consumer is not None  # `_open` ran
        partitions = self._partitions
        if time.monotonic() >= times.metadata:
            partitions.assign(consumer)
            times.metadata = time.monotonic() + METADATA_EVERY_S
        messages = ready_batch(consumer, BATCH, POLL_TIMEOUT_S)
        if messages:
            self.broker_down = False
            self.handle(messages)
        self._commit()
        if self._read_through is not None:
            self._read_through.step(partitions.reading, partial(partitions.read_to, consumer))
        partitions.read_again()
        self.after_batch()
        if not self.caught_up.is_set():
            partitions.check_caught_up(consumer)
        if time.monotonic() >= times.lag:
            times.lag = time.monotonic() + LAG_EVERY_S
            self._m_lag.set(unread_records(consumer, self.topic, list(self.roles)))

    def _kafka_error(self, exc: KafkaException, error: KafkaError | None) -> None:
        """One that goes away by itself is retried, quietly while a fresh start explains
        it; anything else is survived like any other exception."""
        if error is None or not _passing(error):
            self._survive(exc)
            return
        self._rewind()  # raised by consume(), it dropped what it fetched
        if self._throttle.allow(("retriable", error.code())) is not None:
            young = error.code() in STARTING_CODES and self._starting.young(error.code())
            log.log(
                logging.INFO if young else logging.WARNING,
                "intake of %s: %s; retrying",
                self.topic,
                error.str(),
            )
        self._stopping.wait(ERROR_PAUSE_S)

    def _rewind(self) -> None:
        """Read a batch whose handling failed before it was settled again, from its first
        record on. Reading on past it would leave its records undelivered, and every
        later commit of their partitions held back, until a restart. Every other
        partition read is sought back to after what was handled: a consume() that
        raised moved the client past what it fetched, and confluent-kafka destroys that
        batch (`Consumer_consume`, when a callback failed inside the call); where
        nothing was lost, the seek goes where the client stands."""
        firsts, self._unsettled = self._unsettled, None
        self._records.forget_batch()
        self._markers.forget_from(firsts or {})
        if self._consumer is None:
            return
        if firsts:
            self.ledger.rewind(firsts)
        held = self.ledger.partitions
        seeks = {p: o for p, o in (firsts or {}).items() if p in held}
        for partition in self._partitions.reading:
            ledger = held.get(partition)
            if partition not in seeks and ledger is not None and not ledger.revoked:
                next_offset = ledger.next_offset
                seeks[partition] = OFFSET_BEGINNING if next_offset is None else next_offset
        try:
            for partition, offset in seeks.items():
                self._consumer.seek(TopicPartition(self.topic, partition, offset))
        except Exception as exc:
            # Reading on would commit past the forgotten records: stop instead, and
            # read them again after the restart.
            log.exception("intake of %s: could not go back to a failed batch", self.topic)
            self._stopping.set()
            self._on_fatal(f"intake of {self.topic} could not re-read a failed batch: {exc}")
            return
        if not firsts:
            return
        log.warning(
            "intake of %s: reading the failed batch again from %s",
            self.topic,
            ", ".join(f"{p}@{o}" for p, o in sorted(firsts.items())),
        )

    def _storage_fault(self, fault: Exception) -> None:
        """Stop reading: every record from here on would fail alike. What was synced is
        committed on the way out; the rest stays uncommitted, to be read again."""
        self._stopping.set()
        self._m_loop_errors.inc()
        self._on_fatal(
            f"storage fault in precise mode ({fault}); records of {self.topic} not yet "
            "on disk stay uncommitted and are read again after a restart"
        )

    def handle(self, messages: list[Message]) -> None:
        """Store a batch durably, commit it, then buffer what belongs in memory.

        Each record is decided and framed by `RecordIntake.read_batch`. Only the
        offsets of records not durable at the sync (dead letters on their way) are
        tracked one by one; the rest of the batch moves each partition's next offset."""
        now_ms = int(time.time() * 1000)
        in_memory: list[tuple[SlotRecord, float]] = []
        ours, ledgers = self._ours(messages)
        pending = self._records.read_batch(ours, ledgers, now_ms)
        if self._batch_ends:  # before any write: a crash from here on reads it again
            self._offsets.wrote([(led.partition, end) for led, end in self._batch_ends.items()])
        self._records.write_batch(in_memory)
        self._markers.apply_moves(in_memory)
        if ours:
            self._store.sync()
            self._cancels.sync()
            self._reschedules.sync()
            self._check_storage()
        if self._markers.answered:  # acknowledged before the markers' offsets commit
            answered, self._markers.answered = self._markers.answered, []
            self._answer(answered)
        self.ledger.advance_many(
            {ledger: (end, pending.get(ledger, [])) for ledger, end in self._batch_ends.items()}
        )
        self._unsettled = None
        self._commit()
        self._markers.retire_matched()
        if in_memory:
            self._wheel.admit(in_memory)

    def _ours(self, messages: list[Message]) -> tuple[list[Message], list[PartitionLedger]]:
        """The batch's records of partitions this intake holds, and their ledgers; notes
        where each partition's part of the batch starts (to read it again after a
        failure) and ends."""
        ours: list[Message] = []
        ledgers: list[PartitionLedger] = []
        firsts: dict[int, int] = {}
        ends: dict[PartitionLedger, int] = {}
        held = self.ledger.partitions
        consumed = 0
        for message in messages:
            if message.error() is not None:
                self._message_error(message)
                continue
            consumed += 1
            ledger = held.get(message.partition() or 0)
            if ledger is None:
                continue  # not ours (any more)
            offset = message.offset() or 0
            if ledger not in ends:
                firsts[ledger.partition] = offset
                self._partitions.check_origin(ledger.partition, offset)
            ends[ledger] = offset + 1
            ours.append(message)
            ledgers.append(ledger)
        self._unsettled = firsts
        self._batch_ends = ends
        self._m_consumed.inc(consumed)
        return ours, ledgers

    def _message_error(self, message: Message) -> None:
        error = message.error()
        assert error is not None
        if error.code() == KafkaError._PARTITION_EOF:
            return
        if self._throttle.allow(("message", error.code())) is not None:
            log.warning("%s: %s", self.topic, error.str())

    def _commit(self, *, final: bool = False) -> None:
        """Commit what is durable: asynchronously while running (the broker's answer
        comes back through `on_commit` during a later consume, and waiting for it was a
        sixth of the intake's time), synchronously at the end. Only confirmed offsets
        count as committed."""
        asked = self._asked
        pairs = [(p, o) for p, o in self.ledger.to_commit() if final or asked.get(p) != o]
        if not pairs or self._consumer is None:
            return
        self._offsets.committed(pairs)  # all below is durable (the ledger's rule)
        offsets = [TopicPartition(self.topic, p, o) for p, o in pairs]
        try:
            if final:
                self.on_commit(None, self._consumer.commit(offsets=offsets, asynchronous=False))
                return
            self._consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as exc:
            self._m_commit_failures.inc()
            if self._throttle.allow("commit") is not None:
                log.warning("%s: commit failed (%s); trying again", self.topic, exc)
            return
        asked.update(pairs)

    def on_commit(self, error: KafkaError | None, partitions: list[TopicPartition] | None) -> None:
        """The broker's answer to a commit: what it confirmed is committed; anything else
        is asked again at the next commit."""
        done, _failed = self._answered(error, partitions)
        for tp in partitions or []:
            if self._asked.get(tp.partition) == tp.offset:
                del self._asked[tp.partition]
        self.ledger.committed([(tp.partition, tp.offset) for tp in done])

    def _shutdown(self) -> None:
        try:
            self._commit(final=True)
        except Exception:
            log.exception(
                "%s: final commit failed; uncommitted records will be re-read", self.topic
            )
        if self._keeper is not None:
            self._keeper.close()
