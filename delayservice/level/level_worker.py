"""One delay level, wired as the design card draws it: consumer thread -> buffer -> forwarder."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer

from delayservice.forward.build import build_forwarder
from delayservice.forward.forwarder import Routes
from delayservice.kafka import client_config
from delayservice.kafka.broker_clock import BrokerClock
from delayservice.kafka.client_seam import ConsumerClient
from delayservice.level.consumer_loop import ConsumerLoop
from delayservice.level.flow_control import FlowControl
from delayservice.level.memory_budget import MemoryBudget
from delayservice.level.partition_group import PartitionGroup
from delayservice.levels import Level
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.settings import Settings

log = logging.getLogger(__name__)


def transactional_id(settings: Settings, level: Level) -> str:
    """Stable per instance and level: a restarted instance fences its predecessor."""
    return f"{settings.group_id}-{settings.instance_name}-{level.topic}"


def level_group_id(settings: Settings, level: Level) -> str:
    """The consumer group that forwards `level`, shared by every instance."""
    return f"{settings.group_id}-{level.topic}"


class LevelWorker:
    def __init__(
        self,
        level: Level,
        settings: Settings,
        metrics: ServiceMetrics,
        budget: MemoryBudget,
        on_fatal: Callable[[str], None],
        make_producer: Callable[[dict[str, Any]], Any] = Producer,
        broker_clock: BrokerClock | None = None,
    ) -> None:
        """Each level has its own producer: a commit point flushes (or commits the
        transaction of) exactly what this level sent. Due times are met by
        `broker_clock` (the process's, shared by its levels: this host's clock held
        back to the broker's)."""
        clock = broker_clock if broker_clock is not None else BrokerClock()
        self.level = level
        client_id = f"delayservice-{socket.gethostname()}-{os.getpid()}-{level.topic}"
        exactly_once = settings.guarantee == "exactly-once"
        levels = settings.level_set()
        previous = max((lv.delay_ms for lv in levels if lv.delay_ms < level.delay_ms), default=0)
        self.group = PartitionGroup(
            level.delay_ms,
            clock.time,
            previous,
            metrics.level_mismatches.labels(level.name, "not_append_time").inc,
        )
        budget.register(self.group)
        routes = Routes(
            levels,
            settings.precise_topic if settings.precise else None,
            settings.dead_letter_topic,
            settings.internal_topics(),
            previous,
        )
        self.forwarder = build_forwarder(
            level,
            settings,
            metrics,
            self.group,
            routes,
            make_producer,
            on_fatal,
            commit_interval_s=settings.commit_interval(),
            transactional_id=transactional_id(settings, level) if exactly_once else None,
            clock=clock,
        )
        group_id = level_group_id(settings, level)
        instance_id = f"{settings.instance_name}-{level.topic}"

        def make_consumer(callbacks: dict[str, Any]) -> ConsumerClient:
            config = client_config.consumer(settings, group_id, client_id, instance_id)
            return Consumer({**config, **callbacks})

        self.loop = ConsumerLoop(
            level,
            make_consumer,
            self.group,
            FlowControl(settings.pause_high_water, settings.pause_low_water, budget),
            self.forwarder,
            metrics,
            on_fatal=on_fatal,
            rejoin_timeout_s=max(10.0, 2 * settings.session_timeout_s),
            stop_timeout_s=max(1.0, settings.shutdown_timeout_s - 5.0),
            broker_clock=clock,
        )
        metrics.level_delay.labels(level.name, level.topic).set(level.delay_ms / 1000)
        self._stall_budget_s = settings.retry_give_up_s

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
        stalled = self.forwarder.stalled(self._stall_budget_s)
        if stalled is not None:
            return False, f"{topic}: {stalled}"
        owned = self.loop.owned()
        return True, f"{topic}: owns {','.join(map(str, owned)) if owned else 'no partitions'}"
