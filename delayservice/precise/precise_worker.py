"""Precise mode, wired: intake thread -> slot files -> loader -> buffer -> forwarder.

It forwards through the level workers' forwarder (`Forwarder`: a producer that
reports only failures, and commit points that flush it or, exactly-once, commit its
transaction) with its own producer; its metrics carry the level label `exact`. The
settle protocol: at each commit point the forwarder hands over the records it made
durable (forwarded or dead-lettered), and only those settle: a slot's record gets its
settled mark (its file is deleted with the last one), a dead letter of the intake lets
its offset commit. Failed records go again or are dead-lettered by the forwarder's
`Failures` rules before they settle; nothing sent settles before a flush said it is
durable, or its transaction committed. Exactly-once, each transaction also carries the
record of what it delivered, and the replies to markers (`delivery_log`); with two
copies, the replica's copies go out through a second forwarder under the owner's
transactional id (`takeover`).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from delayservice.kafka import client_config
from delayservice.kafka.client_seam import ConsumerClient, ProducerClient
from delayservice.levels import Level
from delayservice.markers.replies import MarkerReplies
from delayservice.metrics.heartbeat import STUCK_S
from delayservice.metrics.service_metrics import DONE_DROP_REASONS, ServiceMetrics
from delayservice.precise.delivery.delivered_position import delivered_position_path
from delayservice.precise.delivery.delivery_log import DeliveryLog
from delayservice.precise.delivery.progress import Progress
from delayservice.precise.delivery.takeover import Takeover, replicated_owner
from delayservice.precise.intake.admission import Admission
from delayservice.precise.intake.intake import Intake
from delayservice.precise.intake.offset_ledger import LevelLedger
from delayservice.precise.placement import Placement, Role
from delayservice.precise.precise_forwarders import PreciseForwarders
from delayservice.precise.settle import settle_unsent
from delayservice.precise.storage.census_export import CensusExport
from delayservice.precise.storage.data_dir import DataDir
from delayservice.precise.storage.storage_fault import StorageError
from delayservice.precise.wheel.held_bytes import HeldBytes
from delayservice.precise.wheel.read_through import ReadThrough, ReadThroughRounds
from delayservice.precise.wheel.slot_buffer import SlotBuffer
from delayservice.precise.wheel.wheel import Wheel
from delayservice.settings import Settings

log = logging.getLogger(__name__)

LEVEL_NAME = "exact"
FAR_LEVEL_NAME = "exact-far"
"""The far topic's `level` label: its wheel and threads are its own."""


@dataclass(frozen=True, slots=True)
class PreciseLevel(Level):
    """A precise topic in the shape the shared forwarder and metrics expect."""

    label: str = LEVEL_NAME

    @property
    def name(self) -> str:
        return self.label


class _Outcomes:
    def __init__(self, metrics: ServiceMetrics) -> None:
        self._cancels = metrics.precise_cancels
        for outcome in ("cancelled", "too_late", "unmatched", "refused"):
            self._cancels.labels(outcome)
            metrics.precise_reschedules.labels(outcome)
        metrics.precise_reschedules.labels("moved")
        self._takeovers = metrics.precise_takeovers
        self._cleaned = metrics.precise_cleaned

    def cancelled(self, outcome: str, count: int = 1) -> None:
        self._cancels.labels(outcome).inc(count)

    def cleaned(self) -> None:
        self._cleaned.inc()

    def took_over(self) -> None:
        self._takeovers.inc()


def precise_group_id(settings: Settings, member: int, *, far: bool = False) -> str:
    """The group member `member` commits its intake of the precise topic (or the far
    one) under; placement is static, so the group only keeps offsets."""
    return f"{settings.group_id}-precise{'-far' if far else ''}-{member}"


def precise_transactional_id(settings: Settings, member: int, *, far: bool = False) -> str:
    """The transactional id member `member` forwards the precise topic (or the far one)
    under: stable, so a restarted member fences its predecessor's open transaction."""
    return f"{precise_group_id(settings, member, far=far)}-forward"


def _nothing() -> None:
    pass


class _Consumers:
    """The intake's consumer and the progress reader's, under this member's group."""

    def __init__(self, settings: Settings, topic: str, *, far: bool) -> None:
        self._settings = settings
        self._client_id = f"delayservice-{socket.gethostname()}-{os.getpid()}-{topic}"
        self._group = precise_group_id(settings, settings.precise_member, far=far)

    def for_intake(self, callbacks: dict[str, Any]) -> ConsumerClient:
        return self._make(callbacks, self._group)

    def for_progress(self, callbacks: dict[str, Any]) -> ConsumerClient:
        return self._make(callbacks, f"{self._group}-progress")

    def for_delivered(self, overrides: dict[str, Any]) -> ConsumerClient:
        return self._make(overrides, f"{self._group}-delivered")

    def _make(self, callbacks: dict[str, Any], group_id: str) -> ConsumerClient:
        config = client_config.consumer(self._settings, group_id, self._client_id)
        return Consumer({**config, **callbacks})


class PreciseWorker:
    def __init__(
        self,
        settings: Settings,
        metrics: ServiceMetrics,
        producer: ProducerClient,
        on_fatal: Callable[[str], None],
        make_producer: Callable[[dict[str, Any]], Any] = Producer,
        *,
        far: bool = False,
        held: HeldBytes | None = None,
        clock: Any = time,
    ) -> None:
        """The precise topic's worker, or with `far` the far topic's. `producer`
        carries progress reports (replicas) and replies to markers; forwards go through
        a producer of the worker's own, made by `make_producer`, as a level's do.
        `held`: the memory cap this wheel shares with the other's. `clock` (`time()`
        and `monotonic()`): what the wheel, the forwarders and the delivery logs read
        the time from (a fake one in the simulation). Every part is wired here, once,
        in the order records flow through them."""
        topic = settings.precise_far_topic if far else settings.precise_topic
        level_name = FAR_LEVEL_NAME if far else LEVEL_NAME
        self.level = PreciseLevel(0, 0, topic, level_name)
        self._on_fatal, self._clock = on_fatal, clock
        # Readiness: within seconds, not the whole retry budget (minutes).
        self._stall_budget_s = min(settings.retry_give_up_s, STUCK_S)
        self._stopping = False
        self.disk = DataDir(settings.data_dir, topic, self._storage_fault)
        self.store, self.cancels, self.reschedules = (
            self.disk.store,
            self.disk.cancels,
            self.disk.reschedules,
        )
        self.placement = Placement(
            settings.precise_members, settings.precise_member, settings.replicas
        )
        self.ledger = LevelLedger()
        """The intake's offsets: each commits once its record is durable (slot file
        synced, or dead letter flushed)."""
        roles: dict[int, Role] = {}  # this member's role per partition, as assigned
        consumers = _Consumers(settings, topic, far=far)
        done_topic = settings.precise_far_done_topic if far else settings.precise_done_topic
        dropped = metrics.precise_done_dropped
        for reason in DONE_DROP_REASONS:  # each series exists from the start, at 0
            dropped.labels(level_name, reason)

        def count_dropped(reason: str) -> None:
            dropped.labels(level_name, reason).inc()

        self.delivery = (
            DeliveryLog(
                done_topic,
                settings.precise_outcomes_topic,
                settings.precise_member,
                consumers.for_delivered,
                position_file=delivered_position_path(settings.data_dir, topic),
                clock=clock.monotonic,
                slot_exists=lambda partition, second: (
                    self.store.size(partition, second) is not None
                ),
                committed_past=self._committed_past,
                members=settings.precise_members,
                dropped=count_dropped,
            )
            if settings.guarantee == "exactly-once"
            else None
        )
        takeover_ms = int(settings.takeover_delay_s * 1000)
        self.progress = (
            Progress(
                done_topic,
                self.placement,
                producer,
                consumers.for_progress,
                self.ledger.last_committed,
                self.store.origin,
                self.store.earliest,
                takeover_ms,
                roles,
                dropped=count_dropped,
                level_name=level_name,
            )
            if settings.replicas == 2
            else None
        )
        takeover: Takeover | None = None
        copies_log: DeliveryLog | None = None
        owner = replicated_owner(self.placement)
        if self.delivery is not None and self.progress is not None:
            self.delivery.others_read = self.progress.wait_read_past
            copies_log = DeliveryLog(
                done_topic,
                settings.precise_outcomes_topic,
                owner,
                consumers.for_delivered,
                slot_exists=lambda partition, second: (
                    self.store.size(partition, second) is not None
                ),
                writer=settings.precise_member,
                members=settings.precise_members,
                clock=clock.monotonic,
                dropped=count_dropped,
            )
            copies_log.others_read = self.progress.wait_read_past
            takeover = Takeover(copies_log)
        self.copies_log = copies_log
        self.read_through = ReadThrough(settings.cancel_lead_ms / 1000)
        """How far the intake has read: what the wheel may hand the forwarders."""
        self.wheel = Wheel(
            self.store,
            self.cancels,
            self.reschedules,
            self.placement,
            _Outcomes(metrics),
            settings.precise_lookahead_s,
            takeover_s=settings.takeover_delay_s,
            coverage=self.progress,
            horizon_s=settings.precise_horizon_s,
            clock=clock.time,
            held=held if held is not None else HeldBytes(settings.max_buffered_bytes),
            topic=topic,
            unread=self.disk.intake_offsets.in_flight(),
            delivered=self.delivery,
            takeover=takeover,
            level_name=level_name,
            settle_unsent=lambda records: settle_unsent(records, self.ledger),
        )
        buffer = self.wheel.buffer
        forwarders = PreciseForwarders(
            self.level, settings, metrics, make_producer, on_fatal, clock, self.wheel, self.ledger
        )
        self.forwarder = forwarders.owner(
            self.delivery,
            transactional_id=(
                precise_transactional_id(settings, settings.precise_member, far=far)
                if self.delivery is not None
                else None
            ),
            replicated=takeover is not None,
        )
        self.takeover_forwarder = forwarders.takeover(
            takeover, owner, precise_transactional_id(settings, owner, far=far)
        )
        replies = MarkerReplies(
            settings.precise_outcomes_topic,
            topic,
            producer,
            settings.precise_member,
            lambda partition: role.value if (role := roles.get(partition)) else None,
            in_transaction=self.delivery.answer if self.delivery is not None else None,
        )
        self.intake = Intake(
            topic,
            consumers.for_intake,
            self.wheel,
            self.store,
            self.cancels,
            self.reschedules,
            self.ledger,
            Admission(self.level, settings.max_delay_ms, settings.internal_topics(), metrics),
            lambda record: buffer.schedule_many([(record, 0.0)]),
            self.placement,
            metrics,
            intake_offsets=self.disk.intake_offsets,
            level_name=level_name,
            takeover_ms=takeover_ms,
            max_delay_ms=settings.max_delay_ms,
            on_fatal=on_fatal,
            after_batch=self.progress.report if self.progress is not None else _nothing,
            on_caught_up=self.wheel.wake_takers,
            check_storage=self.disk.check,
            answer=replies.send,
            roles=roles,
            far=far,
            read_through=ReadThroughRounds(
                topic,
                lambda: AdminClient(client_config.admin(settings)),
                self.read_through,
                clock.time,
            ),
        )
        self.wheel.hold_until(self.intake.caught_up)
        self.wheel.read_through(self.read_through)
        self._producer = producer
        self._flush_timeout = max(1.0, settings.shutdown_timeout_s - 10.0)
        self._export(metrics, settings.precise_lookahead_s, buffer)
        self.census = CensusExport(self.disk.root, self.cancels, metrics, level_name)
        log.info(
            "precise mode: %s, %s, data in %s, member %d of %d, %d replica(s), "
            "%d slot files on disk",
            topic,
            settings.guarantee,
            self.disk.root,
            settings.precise_member,
            settings.precise_members,
            settings.replicas,
            self.wheel.disk_slots,
        )

    def _export(self, metrics: ServiceMetrics, lookahead_s: float, buffer: SlotBuffer) -> None:
        name = self.level.name
        metrics.level_delay.labels(name, self.level.topic).set(lookahead_s)
        copies = self.wheel.takeover_buffer
        metrics.buffered_messages.labels(name).set_function(
            lambda: float(len(buffer) + (len(copies) if copies is not None else 0))
        )
        loaded = metrics.precise_slot_files.labels(name, "loaded")
        loaded.set_function(lambda: float(self.wheel.loaded_slots))
        on_disk = metrics.precise_slot_files.labels(name, "on_disk")
        on_disk.set_function(lambda: float(self.wheel.disk_slots - self.wheel.loaded_slots))
        metrics.precise_disk_bytes.labels(name).set_function(lambda: float(self.store.disk_bytes()))
        metrics.precise_read_through_lag.labels(name).set_function(
            lambda: self.read_through.lag_s(self._clock.time())
        )

    def _committed_past(self, partition: int, offset: int) -> bool:
        """Whether the intake has committed `partition` past `offset`."""
        committed = self.ledger.last_committed(partition)
        return committed is not None and committed > offset

    def _storage_fault(self, fault: StorageError) -> None:
        """A fault of the disk on any thread stops the daemon (see `storage_fault`)."""
        if not self._stopping:
            self._on_fatal(
                f"storage fault in precise mode ({fault}); records not yet on disk stay "
                "uncommitted and are read again after a restart"
            )

    def start(self) -> None:
        self.forwarder.start()
        if self.takeover_forwarder is not None:
            self.takeover_forwarder.start()
        self.wheel.start()
        self.census.start()
        if self.progress is not None:
            self.progress.start()
        self.intake.start()

    def request_stop(self) -> None:
        self._stopping = True  # faults met while stopping change no exit code
        for delivery in (self.delivery, self.copies_log):
            if delivery is not None:
                delivery.stopping()
        self.intake.request_stop()
        self.forwarder.request_stop()
        if self.takeover_forwarder is not None:
            self.takeover_forwarder.request_stop()

    def join(self, timeout: float) -> bool:
        """Stop in order: no more intake, no more loading, then let what was sent land.
        Whatever is still held stays in its slot file for the next start."""
        deadline = time.monotonic() + timeout
        stopped = self.intake.join(timeout)
        # The forwarder's last commit point settles what it sent; the loader's last
        # pass then writes those settled marks.
        self.forwarder.stop(max(0.1, deadline - time.monotonic()))
        if self.takeover_forwarder is not None:
            self.takeover_forwarder.stop(max(0.1, deadline - time.monotonic()))
        self.wheel.stop(max(0.1, deadline - time.monotonic()))
        self.census.stop(max(0.1, deadline - time.monotonic()))
        if self.progress is not None:
            self.progress.stop(max(0.1, deadline - time.monotonic()))
        for delivery in (self.delivery, self.copies_log):
            if delivery is not None:
                delivery.close()
        self._producer.flush(max(0.1, min(self._flush_timeout, deadline - time.monotonic())))
        self.disk.close()
        return stopped

    @property
    def name(self) -> str:
        return self.level.name

    def health(self) -> tuple[bool, str]:
        topic = self.level.topic
        threads = [self.intake.is_alive(), self.wheel.is_alive(), self.forwarder.is_alive()]
        if self.progress is not None:
            threads.append(self.progress.is_alive())
        if self.takeover_forwarder is not None:
            threads.append(self.takeover_forwarder.is_alive())
        if not all(threads):
            return False, f"{topic}: worker thread stopped"
        if self.intake.broker_down:
            return False, f"{topic}: broker unreachable"
        stuck = self.intake.stuck()
        if stuck is not None:
            return False, stuck
        if not self.intake.assigned.is_set():
            return False, f"{topic}: reading partition metadata"
        if self.delivery is not None and not self.delivery.learned:
            return False, f"{topic}: reading what its transactions delivered"
        if not self.intake.caught_up.is_set():
            left = self.intake.records_left
            return False, f"{topic}: catching up" + (f": {left} records left" if left else "")
        forwarders = [f for f in (self.forwarder, self.takeover_forwarder) if f is not None]
        for forwarder in forwarders:  # the takeover's too: it forwards what the owner did not
            stalled = forwarder.stalled(self._stall_budget_s)
            if stalled is not None:
                return False, f"{topic}: {forwarder.name}: {stalled}"
        roles = ",".join(f"{p}:{r.value}" for p, r in sorted(self.intake.roles.items()))
        return True, f"{topic}: holds {roles or 'no partitions'}"
