"""Precise mode's forwarding on fakes: the wheel's buffer, the forwarder `PreciseWorker`
builds (`build_forwarder` with `precise_routes`) and its settle protocol
(`settle_durable`), with a fake producer and a stand-in for the wheel that records what
settles."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from delayservice.forward.build import build_forwarder
from delayservice.forward.forwarder import Forwarder
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.precise.intake.admission import Admission
from delayservice.precise.intake.offset_ledger import LevelLedger
from delayservice.precise.precise_forwarders import precise_commit_interval, precise_routes
from delayservice.precise.precise_worker import LEVEL_NAME, PreciseLevel
from delayservice.precise.settle import settle_durable
from delayservice.precise.storage.slot_record import SlotRecord
from delayservice.precise.wheel.slot_buffer import SlotBuffer
from delayservice.precise.wheel.slot_ledger import SlotTracker
from delayservice.settings import Settings
from delayservice.settings_loading import load_settings
from tests.level.fakes import (
    DLQ,
    OTHER_TARGET,
    TARGET,
    FakeClock,
    FakeProducer,
    Sent,
    envelope_headers,
    message,
)

PRECISE_TOPIC = "timers"
LEVEL = PreciseLevel(0, 0, PRECISE_TOPIC)


class SlotsSettled:
    """Stands in for the wheel: what the settle protocol settles in slots."""

    def __init__(self) -> None:
        self.settled: list[tuple[int, int]] = []

    def settle_many(
        self, done: list[tuple[SlotTracker, int]], then: Callable[[], None] | None = None
    ) -> None:
        self.settled.extend((tracker.partition, offset) for tracker, offset in done)
        if then is not None:
            then()


@dataclass
class PreciseRig:
    settings: Settings
    registry: CollectorRegistry
    clock: FakeClock | None
    buffer: SlotBuffer
    forwarder: Forwarder
    admission: Admission
    wheel: SlotsSettled
    offsets: LevelLedger
    """The intake's offsets: a dead letter of the intake settles here."""
    producers: list[FakeProducer]
    fatal: list[str]
    next_offset: dict[int, int] = field(default_factory=dict)

    @property
    def producer(self) -> FakeProducer:
        return self.producers[-1]

    def now_ms(self) -> int:
        return self.clock.ms() if self.clock is not None else int(time.time() * 1000)

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the precise level (a per-level family) or of its worker."""
        for default in ({"level": LEVEL_NAME}, {"worker": LEVEL_NAME}):
            value = self.registry.get_sample_value(name, {**default, **labels})
            if value is not None:
                return value
        return 0.0

    def hold(
        self,
        mid: str,
        *,
        partition: int = 0,
        due_in_ms: int = 0,
        target: str = TARGET,
        headers: list[Any] | None = None,
        key: bytes | None = b"k",
        value: bytes | None = b"v",
        from_intake: bool = False,
    ) -> SlotRecord:
        """A record as the wheel hands it to the buffer (loaded from its slot file), or,
        `from_intake`, as the intake hands over one to dead-letter."""
        offset = self.next_offset.get(partition, 0)
        self.next_offset[partition] = offset + 1
        delay = 10_000
        if headers is None:
            headers = envelope_headers(target=target, delay_ms=delay, message_id=mid)
        now = self.now_ms()
        msg = message(
            partition, offset, now + due_in_ms - delay, headers=headers, key=key, value=value,
            topic=PRECISE_TOPIC,
        )  # fmt: skip
        if from_intake:
            ledger = self.offsets.partitions.get(partition) or self.offsets.assign(partition)
            self.offsets.track(ledger, offset, 0)
            record = self.admission.hold(msg, ledger, now)
            self.buffer.schedule_many([(record, 0.0)])
            return record
        record = self.admission.hold(msg, SlotTracker(partition, now // 1000), now)
        assert record.problem is None, record.problem
        self.buffer.schedule_many([(record, record.due_ms / 1000)])
        return record

    def step(self, passes: int = 1) -> None:
        """Forwarder passes, each ending at a commit point."""
        for _ in range(passes):
            self.forwarder.step(commit=True)

    def settled(self) -> list[int]:
        """Offsets (partition 0) settled in their slots, in order."""
        return [offset for partition, offset in self.wheel.settled if partition == 0]

    def committable(self, partition: int = 0) -> int | None:
        """The intake's committable offset of `partition`."""
        return self.offsets.partitions[partition].committable()

    def dead_letters(self) -> list[Sent]:
        return [s for s in self.producer.reports if s.topic == DLQ and s.result is None]


def make_precise_rig(
    *,
    clock: FakeClock | None = None,
    backoff: tuple[float, float] = (1.0, 8.0),
    give_up_s: float = 10.0,
    commit_interval_s: float = 1.0,
    topics: dict[str, int] | None = None,
) -> PreciseRig:
    settings = load_settings(
        levels="1s",
        precise=True,
        precise_topic=PRECISE_TOPIC,
        dead_letter_topic=DLQ,
        retry_backoff_s=backoff[0],
        retry_backoff_max_s=backoff[1],
        retry_give_up_s=give_up_s,
        commit_interval_s=commit_interval_s,
    )
    registry = CollectorRegistry()
    metrics = ServiceMetrics(registry)
    all_topics = dict(topics if topics is not None else {TARGET: 3, OTHER_TARGET: 3, DLQ: 1})
    producers: list[FakeProducer] = []

    def make_producer(config: dict[str, Any]) -> FakeProducer:
        producers.append(FakeProducer(all_topics, clock, config))
        return producers[-1]

    buffer = SlotBuffer(clock.time if clock is not None else time.time, topic=PRECISE_TOPIC)
    wheel = SlotsSettled()
    offsets = LevelLedger()
    fatal: list[str] = []

    def settle(runs: Any) -> None:
        settle_durable(runs, wheel=wheel, offsets=offsets)

    forwarder = build_forwarder(
        [LEVEL],
        LEVEL.name,
        settings,
        metrics,
        buffer,
        precise_routes(settings),
        make_producer,
        fatal.append,
        commit_interval_s=precise_commit_interval(settings),
        settle=settle,
        clock=clock if clock is not None else time,
    )
    admission = Admission(LEVEL, settings.max_delay_ms, settings.internal_topics(), metrics)
    return PreciseRig(
        settings, registry, clock, buffer, forwarder, admission, wheel, offsets, producers,
        fatal,
    )  # fmt: skip
