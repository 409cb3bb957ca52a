"""A level worker, wired as the design card draws it: consumer thread -> buffer ->
forwarder, over one or several levels (`layout`: one worker for all the levels of a
process, or one per level)."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer

from delayservice.forward.build import build_forwarder
from delayservice.kafka import client_config
from delayservice.kafka.broker_clock import BrokerClock
from delayservice.kafka.client_seam import ConsumerClient
from delayservice.level.consumer_loop import ConsumerLoop
from delayservice.level.flow_control import FlowControl
from delayservice.level.layout import OtherLayout, WorkerPlan
from delayservice.level.level_route import level_routes
from delayservice.level.markers.level_markers import LevelMarkers
from delayservice.level.memory_budget import MemoryBudget
from delayservice.level.partition_group import PartitionGroup
from delayservice.levels import Level
from delayservice.metrics.heartbeat import STUCK_S
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.settings import Settings

log = logging.getLogger(__name__)


class LevelWorker:
    def __init__(
        self,
        plan: WorkerPlan,
        settings: Settings,
        metrics: ServiceMetrics,
        budget: MemoryBudget,
        on_fatal: Callable[[str], None],
        make_producer: Callable[[dict[str, Any]], Any] = Producer,
        broker_clock: BrokerClock | None = None,
        markers: LevelMarkers | None = None,
    ) -> None:
        """One consumer, one forwarder thread and one producer (one transaction) for the
        levels of `plan`: a commit point flushes (or commits the transaction of)
        exactly what this worker sent. Due times are met by `broker_clock` (the
        process's, shared by its workers: this host's clock held back to the
        broker's). `markers`: the process's cancels and reschedules (the daemon always
        gives them; without, nothing waits for markers and none is honoured)."""
        clock = broker_clock if broker_clock is not None else BrokerClock()
        self.name = plan.name
        self.levels = plan.levels
        client_id = f"delayservice-{socket.gethostname()}-{os.getpid()}-{plan.name}"
        exactly_once = settings.guarantee == "exactly-once"
        all_levels = settings.level_set()
        mismatches = {
            level.topic: metrics.level_mismatches.labels(level.name, "not_append_time")
            for level in plan.levels
        }
        view = (
            markers.for_worker(plan.name, transactional=exactly_once)
            if markers is not None
            else None
        )
        self.group = PartitionGroup(
            [(lv.topic, lv.delay_ms, all_levels.previous_delay_ms(lv)) for lv in plan.levels],
            clock.time,
            lambda topic, count: mismatches[topic].inc(count),
            view,
        )
        budget.register(self.group)
        routes = level_routes(
            all_levels,
            settings.precise_topic if settings.precise else None,
            settings.dead_letter_topic,
            settings.internal_topics(),
            view,
        )
        self.forwarder = build_forwarder(
            plan.levels,
            plan.name,
            settings,
            metrics,
            self.group,
            routes,
            make_producer,
            on_fatal,
            commit_interval_s=settings.commit_interval(),
            transactional_id=plan.transactional_id if exactly_once else None,
            clock=clock,
        )
        self.forwarder.interval.listener = view

        def make_consumer(callbacks: dict[str, Any]) -> ConsumerClient:
            config = client_config.consumer(settings, plan.group_id, client_id, plan.member_id)
            return Consumer({**config, **callbacks})

        self.loop = ConsumerLoop(
            plan.levels,
            make_consumer,
            self.group,
            FlowControl(settings.pause_high_water, settings.pause_low_water, budget),
            self.forwarder,
            metrics,
            on_fatal=on_fatal,
            rejoin_timeout_s=max(10.0, 2 * settings.session_timeout_s),
            stop_timeout_s=max(1.0, settings.shutdown_timeout_s - 5.0),
            broker_clock=clock,
            name=plan.name,
            fallback=OtherLayout(settings, plan.levels),
        )
        for level in plan.levels:
            metrics.level_delay.labels(level.name, level.topic).set(level.delay_ms / 1000)
        # Readiness: within seconds, not the whole retry budget (minutes).
        self._stall_budget_s = min(settings.retry_give_up_s, STUCK_S)

    @property
    def level(self) -> Level:
        """Its first (under the per-level layout, its only) level."""
        return self.levels[0]

    def start(self) -> None:
        self.forwarder.start()
        self.loop.start()

    def request_stop(self) -> None:
        self.loop.request_stop()

    def join(self, timeout: float) -> bool:
        return self.loop.join(timeout)

    def health(self) -> tuple[bool, str]:
        """Ready only once the group has assigned this worker, saying what each of its
        levels owns."""
        name = self.name
        if not self.loop.is_alive() or not self.forwarder.is_alive():
            return False, f"{name}: worker thread stopped"
        if self.loop.broker_down:
            return False, f"{name}: broker unreachable"
        stuck = self.loop.stuck()
        if stuck is not None:
            return False, stuck
        if not self.loop.first_assignment.is_set():
            return False, f"{name}: waiting for the first assignment"
        lost_at = self.loop.unassigned_since
        if lost_at is not None:
            return False, f"{name}: lost its partitions {time.monotonic() - lost_at:.0f}s ago"
        stalled = self.forwarder.stalled(self._stall_budget_s)
        if stalled is not None:
            return False, f"{name}: {stalled}"
        owns = []
        for level in self.levels:
            owned = self.loop.owned(level.topic)
            partitions = ",".join(map(str, owned)) if owned else "no partitions"
            owns.append(f"{level.topic}: owns {partitions}")
        return True, "; ".join(owns)
