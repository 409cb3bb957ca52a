"""Precise mode exactly-once on fakes: a process is a real wheel over a data directory,
the forwarder `PreciseWorker` builds for exactly-once (`build_forwarder` with a
transactional id and the `DeliveryLog`, settling through `settle_delivered`), and
producers registered with one `FakeCoordinator`, so a second process over the same
directory (a restart) fences the first and learns what its transactions committed."""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from delayservice.envelope import Envelope
from delayservice.forward.buffer import Runs
from delayservice.forward.build import build_forwarder
from delayservice.forward.forwarder import Forwarder
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.precise.delivery.delivery_log import DeliveryLog
from delayservice.precise.intake.offset_ledger import LevelLedger
from delayservice.precise.placement import Placement
from delayservice.precise.precise_forwarders import precise_routes
from delayservice.precise.precise_worker import PreciseLevel
from delayservice.precise.settle import settle_delivered
from delayservice.precise.storage.cancel_log import CancelLog
from delayservice.precise.storage.reschedule_log import RescheduleLog
from delayservice.precise.storage.slot_file import StoredRecord, encode
from delayservice.precise.storage.slot_record import SlotRecord
from delayservice.precise.storage.slot_store import SlotStore
from delayservice.precise.wheel.wheel import Wheel
from delayservice.settings import Settings
from delayservice.settings_loading import load_settings
from tests.level.fakes import DLQ, TARGET, FakeClock, Sent
from tests.precise.txn_fakes import DoneReader, FakeCoordinator, FencingProducer
from tests.precise.wheel.test_wheel import Outcomes

PRECISE_TOPIC = "timers"
DONE_TOPIC = f"{PRECISE_TOPIC}_done"
OUTCOMES_TOPIC = f"{PRECISE_TOPIC}_outcomes"
LEVEL = PreciseLevel(0, 0, PRECISE_TOPIC)
TRANSACTIONAL_ID = "delayservice-precise-0-forward"


class KilledError(Exception):
    """The process died right after a transaction committed, before its marks."""


def eos_settings() -> Settings:
    return load_settings(
        levels="1s",
        precise=True,
        precise_topic=PRECISE_TOPIC,
        dead_letter_topic=DLQ,
        guarantee="exactly-once",
    )


class FakeClients:
    """The client factories a rig hands the code under test: every reader and producer
    talks to one fake coordinator, and the rig keeps them to look at."""

    coordinator: FakeCoordinator
    clock: FakeClock
    readers: list[DoneReader]
    producers: list[FencingProducer]

    def _reader(self, overrides: dict[str, Any]) -> DoneReader:
        reader = DoneReader(self.coordinator, DONE_TOPIC)
        reader.isolation = overrides.get("isolation.level", "read_committed")
        self.readers.append(reader)
        return reader

    def _producer(self, config: dict[str, Any]) -> FencingProducer:
        topics = {TARGET: 3, DLQ: 1, DONE_TOPIC: 1, OUTCOMES_TOPIC: 1}
        self.producers.append(FencingProducer(self.coordinator, topics, self.clock, config))
        return self.producers[-1]


class Process(FakeClients):
    """One daemon's precise worker, as far as forwarding goes."""

    def __init__(self, root: Path, coordinator: FakeCoordinator, clock: FakeClock) -> None:
        self.clock = clock
        self.coordinator = coordinator
        self.store = SlotStore(root / "slots")
        self.cancels = CancelLog(root / "cancels.log")
        self.reschedules = RescheduleLog(root / "reschedules.log")
        self.readers: list[DoneReader] = []
        self.dropped: list[str] = []
        """Why the delivery log did not take records of the done topic."""
        self.delivery = DeliveryLog(
            DONE_TOPIC,
            OUTCOMES_TOPIC,
            0,
            self._reader,
            reply_wait_s=5.0,
            position_file=root / f"{PRECISE_TOPIC}.delivered",
            clock=clock.monotonic,
            slot_exists=lambda partition, second: self.store.size(partition, second) is not None,
            members=1,
            dropped=self.dropped.append,
        )
        self.wheel = Wheel(
            self.store,
            self.cancels,
            self.reschedules,
            Placement(1, 0, 1),
            Outcomes(),
            lookahead_s=5.0,
            clock=clock.time,
            topic=PRECISE_TOPIC,
            delivered=self.delivery,
        )
        self.delivery.wake = self.wheel.buffer.wake
        self.producers: list[FencingProducer] = []
        self.fatal: list[str] = []
        self.die_after_commit = False
        settings = eos_settings()
        settle = functools.partial(
            settle_delivered, wheel=self.wheel, offsets=LevelLedger(), delivery=self.delivery
        )

        def settle_or_die(runs: Runs) -> None:
            if self.die_after_commit:
                raise KilledError
            settle(runs)

        self.forwarder: Forwarder = build_forwarder(
            [LEVEL],
            LEVEL.name,
            settings,
            ServiceMetrics(CollectorRegistry()),
            self.wheel.buffer,
            precise_routes(settings),
            self._producer,
            self.fatal.append,
            commit_interval_s=0.1,
            transactional_id=TRANSACTIONAL_ID,
            settle=settle_or_die,
            ledger=self.delivery,
            clock=clock,
        )

    @property
    def reader(self) -> DoneReader:
        """The reader of what committed (another asks where the topic ends)."""
        [reader] = [r for r in self.readers if r.isolation == "read_committed"]
        return reader

    @property
    def producer(self) -> FencingProducer:
        return self.producers[-1]

    def hold(self, offset: int, due_in_s: float, partition: int = 0, target: str = TARGET) -> None:
        """What the intake does for one record: write it to its slot, sync, buffer it."""
        due_ms = self.clock.ms() + int(due_in_s * 1000)
        stored = StoredRecord(
            offset, due_ms, False, f"id-{offset}", target, None, 0, b"k", b"v", []
        )
        tracker = self.wheel.append(partition, due_ms, encode(stored))
        self.store.sync()
        if tracker is not None:
            record = SlotRecord(
                partition, offset, b"k", b"v", [], Envelope(target, 0, f"id-{offset}"),
                due_ms, tracker,
            )  # fmt: skip
            self.wheel.admit([(record, due_ms / 1000)])

    def load(self) -> None:
        """The loader's pass: slots now in reach come into memory."""
        self.wheel._loader.load_due_slots()

    def step(self, passes: int = 1) -> None:
        for _ in range(passes):
            self.forwarder.step(commit=True)

    def killed_after_commit(self) -> None:
        """Reach a commit point, and die right after it committed, before its marks."""
        self.die_after_commit = True
        try:
            self.step()
        except KilledError:
            self.die()
            return
        raise AssertionError("no transaction committed")

    def slot_files(self) -> int:
        return len(self.store.slots())

    def die(self) -> None:
        """kill -9: nothing more is written (the page cache keeps what was)."""
        self.store.close()
        self.cancels.close()


def delivered_ids(coordinator: FakeCoordinator) -> Counter[str]:
    """Per `delay-id`, the copies a read_committed reader of the target sees."""
    return Counter(s.delay_id or "" for s in coordinator.visible(TARGET))


def sent_records(coordinator: FakeCoordinator) -> list[Sent]:
    return coordinator.visible(DONE_TOPIC)
