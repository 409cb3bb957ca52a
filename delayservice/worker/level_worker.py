"""One delay level, wired as the design card draws it: consumer thread -> buffer -> forwarder."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer

from delayservice.kafka import client_config
from delayservice.kafka.client_seam import ConsumerClient, ProducerClient
from delayservice.kafka.target_topics import TargetTopics
from delayservice.levels import Level
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.settings import Settings
from delayservice.timers.base import Scheduler
from delayservice.timers.factory import make_scheduler
from delayservice.worker.admission import Admission
from delayservice.worker.consumer_loop import ConsumerLoop
from delayservice.worker.flow_control import FlowControl
from delayservice.worker.forwarder import Forwarder
from delayservice.worker.ledger import LevelLedger
from delayservice.worker.memory_budget import MemoryBudget
from delayservice.worker.record import HeldRecord

log = logging.getLogger(__name__)


class LevelWorker:
    def __init__(
        self,
        level: Level,
        settings: Settings,
        metrics: ServiceMetrics,
        budget: MemoryBudget,
        on_fatal: Callable[[str], None],
        producer: ProducerClient,
        targets: TargetTopics,
    ) -> None:
        """`producer` and `targets` (its metadata cache) are the process's, shared by
        every level."""
        self.level = level
        self.ledger = LevelLedger(budget)
        self.scheduler: Scheduler[HeldRecord] = make_scheduler(settings.scheduler, clock=time.time)
        client_id = f"delayservice-{socket.gethostname()}-{os.getpid()}-{level.topic}"
        self.producer = producer
        self.forwarder = Forwarder.configured(
            level, self.scheduler, self.ledger, producer, targets, settings, metrics, on_fatal
        )
        group = f"{settings.group_id}-{level.topic}"
        instance_id = f"{settings.instance_name}-{level.topic}"

        def make_consumer(callbacks: dict[str, Any]) -> ConsumerClient:
            config = client_config.consumer(settings, group, client_id, instance_id)
            return Consumer({**config, **callbacks})

        levels = settings.level_set()
        previous = max((lv.delay_ms for lv in levels if lv.delay_ms < level.delay_ms), default=0)
        self.loop = ConsumerLoop(
            level,
            make_consumer,
            self.producer,
            self.scheduler,
            self.ledger,
            FlowControl(settings.pause_high_water, settings.pause_low_water, budget),
            self.forwarder,
            Admission(level, previous, levels.max_delay_ms, settings.internal_topics(), metrics),
            metrics,
            settings.commit_interval_s,
            flush_timeout_s=max(1.0, settings.shutdown_timeout_s - 10.0),
            on_fatal=on_fatal,
            rejoin_timeout_s=max(10.0, 2 * settings.session_timeout_s),
        )
        metrics.level_delay.labels(level.name, level.topic).set(level.delay_ms / 1000)

    def start(self) -> None:
        self.forwarder.start()
        self.loop.start()

    def request_stop(self) -> None:
        self.loop.request_stop()

    def join(self, timeout: float) -> bool:
        return self.loop.join(timeout)

    def health(self) -> tuple[bool, str]:
        """Ready only once the group has assigned this level, saying what it owns."""
        topic = self.level.topic
        if not self.loop.is_alive() or not self.forwarder.is_alive():
            return False, f"{topic}: worker thread stopped"
        if self.loop.broker_down:
            return False, f"{topic}: broker unreachable"
        if not self.loop.first_assignment.is_set():
            return False, f"{topic}: waiting for the first assignment"
        lost_at = self.loop.unassigned_since
        if lost_at is not None:
            return False, f"{topic}: lost its partitions {time.monotonic() - lost_at:.0f}s ago"
        owned = self.loop.owned()
        return True, f"{topic}: owns {','.join(map(str, owned)) if owned else 'no partitions'}"
