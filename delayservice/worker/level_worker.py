"""One delay level, wired as the design card draws it: consumer thread -> buffer -> forwarder."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, Producer

from delayservice.kafka import client_config
from delayservice.kafka.target_topics import TargetTopics
from delayservice.levels import Level
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.settings import Settings
from delayservice.timers.base import Scheduler
from delayservice.timers.factory import make_scheduler
from delayservice.worker.consumer_loop import ConsumerLoop
from delayservice.worker.flow_control import FlowControl
from delayservice.worker.forwarder import Forwarder
from delayservice.worker.ledger import LevelLedger
from delayservice.worker.record import HeldRecord

log = logging.getLogger(__name__)


class LevelWorker:
    def __init__(
        self,
        level: Level,
        settings: Settings,
        metrics: ServiceMetrics,
        on_fatal: Callable[[str], None],
    ) -> None:
        self.level = level
        self.ledger = LevelLedger()
        self.scheduler: Scheduler[HeldRecord] = make_scheduler(settings.scheduler, clock=time.time)
        client_id = f"delayservice-{socket.gethostname()}-{os.getpid()}-{level.topic}"
        self.producer = Producer(client_config.producer(settings, client_id))
        self.forwarder = Forwarder(
            level,
            self.scheduler,
            self.ledger,
            self.producer,
            TargetTopics(self.producer),
            settings.dead_letter_topic,
            metrics,
            (settings.retry_backoff_s, settings.retry_backoff_max_s),
            on_fatal,
        )
        group = f"{settings.group_id}-{level.topic}"
        instance_id = f"{settings.instance_name}-{level.topic}"

        def make_consumer(error_cb: Callable[[KafkaError], None]) -> Consumer:
            return Consumer(
                {
                    **client_config.consumer(settings, group, client_id, instance_id),
                    "error_cb": error_cb,
                }
            )

        self.loop = ConsumerLoop(
            level,
            make_consumer,
            self.producer,
            self.scheduler,
            self.ledger,
            FlowControl(
                settings.pause_high_water, settings.pause_low_water, settings.max_buffered_bytes
            ),
            self.forwarder,
            metrics,
            settings.commit_interval_s,
            flush_timeout_s=max(1.0, settings.shutdown_timeout_s - 10.0),
            on_fatal=on_fatal,
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
        if not self.loop.is_alive() or not self.forwarder.is_alive():
            return False, f"{self.level.topic}: worker thread stopped"
        if self.loop.broker_down:
            return False, f"{self.level.topic}: broker unreachable"
        return True, f"{self.level.topic}: ok"
