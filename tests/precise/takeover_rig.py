"""Two holders of a partition on fakes, exactly-once: an owner (member 0) and its
replica (member 1), each a real wheel over its own data directory with the forwarders
`PreciseWorker` builds for two copies (its own, under its member's transactional id, and
the takeover forwarder, under the owner's), and a real progress reader, all on one
`FakeCoordinator`: an init under an id fences whoever used it before."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from delayservice.envelope import Envelope
from delayservice.forward.build import build_forwarder
from delayservice.forward.forwarder import Forwarder, SharedId
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.precise.delivery.delivery_log import DeliveryLog
from delayservice.precise.delivery.progress import Progress
from delayservice.precise.delivery.takeover import Takeover, replicated_owner
from delayservice.precise.intake.offset_ledger import LevelLedger
from delayservice.precise.placement import Placement, Role
from delayservice.precise.precise_forwarders import precise_routes
from delayservice.precise.settle import settle_delivered
from delayservice.precise.storage.cancel_log import CancelLog
from delayservice.precise.storage.reschedule_log import RescheduleLog
from delayservice.precise.storage.slot_file import StoredRecord, encode
from delayservice.precise.storage.slot_record import SlotRecord
from delayservice.precise.storage.slot_store import SlotStore
from delayservice.precise.wheel.wheel import Wheel
from tests.level.fakes import TARGET, FakeClock, Sent
from tests.precise.eos_rig import (
    DONE_TOPIC,
    LEVEL,
    OUTCOMES_TOPIC,
    PRECISE_TOPIC,
    FakeClients,
    eos_settings,
)
from tests.precise.txn_fakes import DoneReader, FakeCoordinator, FencingProducer
from tests.precise.wheel.test_wheel import Outcomes

TAKEOVER_S = 3.0
PARTITION = 0
"""Owned by member 0, its replica held by member 1."""


def transactional_id(member: int) -> str:
    return f"delayservice-precise-{member}-forward"


class ReportProducer:
    """The non-transactional producer progress reports go through: written at once."""

    def __init__(self, coordinator: FakeCoordinator, clock: FakeClock) -> None:
        self.coordinator = coordinator
        self.clock = clock

    def produce(self, topic: str, value: bytes, key: bytes, **_: Any) -> None:
        self.coordinator.committed.append(Sent(topic, key, value, [], 0, None, self.clock.time()))


class Holder(FakeClients):
    """One member's precise worker, as far as holding and forwarding go."""

    def __init__(
        self, root: Path, coordinator: FakeCoordinator, clock: FakeClock, member: int
    ) -> None:
        self.clock = clock
        self.coordinator = coordinator
        self.member = member
        self.placement = Placement(2, member, 2)
        self.store = SlotStore(root / "slots")
        self.cancels = CancelLog(root / "cancels.log")
        self.reschedules = RescheduleLog(root / "reschedules.log")
        self.outcomes = Outcomes()
        self.readers: list[DoneReader] = []
        self.producers: list[FencingProducer] = []
        self.fatal: list[str] = []
        self.next_offset: dict[int, int] = {}
        roles: dict[int, Role] = {p: r for p in (0, 1) if (r := self.placement.role(p))}
        self.progress = Progress(
            DONE_TOPIC,
            self.placement,
            ReportProducer(coordinator, clock),
            self._reader,
            self.next_offset.get,
            self.store.origin,
            self.store.earliest,
            int(TAKEOVER_S * 1000),
            roles,
        )
        exists = self._slot_exists
        self.delivery = DeliveryLog(
            DONE_TOPIC, OUTCOMES_TOPIC, member, self._reader, reply_wait_s=5.0,
            clock=clock.monotonic, slot_exists=exists,
        )  # fmt: skip
        self.delivery.others_read = self.progress.wait_read_past
        owner = replicated_owner(self.placement)
        self.copies_log = DeliveryLog(
            DONE_TOPIC, OUTCOMES_TOPIC, owner, self._reader, reply_wait_s=5.0,
            clock=clock.monotonic, slot_exists=exists, writer=member,
        )  # fmt: skip
        self.copies_log.others_read = self.progress.wait_read_past
        takeover = Takeover(self.copies_log)
        self.wheel = Wheel(
            self.store, self.cancels, self.reschedules, self.placement, self.outcomes,
            lookahead_s=5.0, takeover_s=TAKEOVER_S, coverage=self.progress,
            clock=clock.time, topic=PRECISE_TOPIC, delivered=self.delivery,
            takeover=takeover,
        )  # fmt: skip
        self.delivery.wake = self.wheel.buffer.wake
        assert self.wheel.takeover_buffer is not None
        self.copies_log.wake = self.wheel.takeover_buffer.wake
        self.forwarder = self._forwarder(
            self.wheel.buffer, self.delivery, member, SharedId("its replica"), "exact"
        )
        self.takeover_forwarder = takeover.forwarder = self._forwarder(
            self.wheel.takeover_buffer,
            self.copies_log,
            owner,
            SharedId("the owner", lazy=True, hold_back_s=TAKEOVER_S),
            "exact-takeover",
        )
        self.progress.start()

    def _forwarder(
        self, buffer: Any, log: DeliveryLog, member: int, shared: SharedId, name: str
    ) -> Forwarder:
        settings = eos_settings()
        return build_forwarder(
            [LEVEL], name, settings, ServiceMetrics(CollectorRegistry()), buffer,
            precise_routes(settings), self._producer, self.fatal.append,
            commit_interval_s=0.1, transactional_id=transactional_id(member),
            settle=functools.partial(
                settle_delivered, wheel=self.wheel, offsets=LevelLedger(), delivery=log
            ),
            ledger=log, shared_id=shared, clock=self.clock,
        )  # fmt: skip

    def _slot_exists(self, partition: int, second: int) -> bool:
        return self.store.size(partition, second) is not None

    def producers_of(self, member: int) -> list[FencingProducer]:
        """This holder's producers under member `member`'s transactional id."""
        tid = transactional_id(member)
        return [p for p in self.producers if p.config["transactional.id"] == tid]

    def hold(self, offset: int, due_ms: int, partition: int = PARTITION) -> None:
        """What the intake does for one record: its copy (the owner's, or the replica's,
        firing the takeover delay late) into its slot, synced, buffered if in memory."""
        replica = self.placement.role(partition) is Role.REPLICA
        fire_ms = due_ms + (int(TAKEOVER_S * 1000) if replica else 0)
        stored = StoredRecord(
            offset, due_ms, replica, f"id-{offset}", TARGET, None, 0, b"k", b"v", []
        )
        tracker = self.wheel.append(partition, fire_ms, encode(stored))
        self.store.sync()
        self.next_offset[partition] = max(self.next_offset.get(partition, 0), offset + 1)
        if tracker is not None:
            record = SlotRecord(
                partition, offset, b"k", b"v", [], Envelope(TARGET, 0, f"id-{offset}"),
                due_ms, tracker,
            )  # fmt: skip
            self.wheel.admit([(record, fire_ms / 1000)])

    @property
    def progress_reader(self) -> DoneReader:
        """The progress reader's consumer (the first made: the thread starts first)."""
        return self.readers[0]

    def report(self) -> None:
        """The intake's progress report (at most once a second in the daemon)."""
        self.progress._next_report = 0.0
        self.progress.report()

    def load(self) -> None:
        self.wheel._loader.load_due_slots()
        self.wheel.write_marks()

    def slot_files(self) -> int:
        return len(self.store.slots())

    def stop(self) -> None:
        self.progress.stop(2.0)
        self.store.close()
        self.cancels.close()


def hold_both(holders: list[Holder], offsets: range, due_ms: int) -> None:
    for holder in holders:
        for offset in offsets:
            holder.hold(offset, due_ms)
