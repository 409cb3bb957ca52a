"""One way to build a forwarder, for a level and for each precise topic alike.

The forwarder needs a producer of its own (a commit point flushes, or commits the
transaction of, exactly what its buffer sent), built with its delivery reports going
back to it and its log lines watched for acknowledgements the broker never confirmed;
and the same producer again, fresh, whenever it must be replaced.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from delayservice.forward.buffer import Buffer, Runs
from delayservice.forward.forwarder import Forwarder, Routes, SharedId
from delayservice.forward.transaction_ledger import TransactionLedger
from delayservice.kafka import client_config
from delayservice.kafka.log_levels import ExpectedFences
from delayservice.kafka.target_topics import TargetTopics
from delayservice.kafka.unconfirmed_acks import watch_unconfirmed
from delayservice.levels import Level
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.settings import Settings


def build_forwarder(
    levels: Sequence[Level],
    name: str,
    settings: Settings,
    metrics: ServiceMetrics,
    buffer: Buffer,
    routes: Routes,
    make_producer: Callable[[dict[str, Any]], Any],
    on_fatal: Callable[[str], None],
    *,
    commit_interval_s: float,
    transactional_id: str | None = None,
    settle: Callable[[Runs], None] | None = None,
    ledger: TransactionLedger | None = None,
    shared_id: SharedId | None = None,
    clock: Any = time,
) -> Forwarder:
    """The forwarder of `buffer`, which holds the records of `levels` (its worker is
    `name`): exactly-once when a `transactional_id` is given, else at-least-once;
    `settle` gets the records each commit point made durable; `ledger` (with a
    `transactional_id`) is what its transactions carry instead of consumer offsets;
    `shared_id`: another holder forwards under the same id (`SharedId`)."""
    client_id = f"delayservice-{socket.gethostname()}-{os.getpid()}-{name}"
    config = client_config.level_producer(settings, client_id, transactional_id)
    unconfirmed = watch_unconfirmed(config)
    if shared_id is not None:
        config["logger"] = ExpectedFences(config["logger"])
    built: list[Forwarder] = []  # its producers report to it, made before it

    def on_report(error: Any, message: Any) -> None:
        built[0].on_report(error, message)

    def new_producer() -> Any:
        return make_producer({**config, "on_delivery": on_report})

    producer = new_producer()
    forwarder = Forwarder(
        levels,
        buffer,
        producer,
        TargetTopics(producer, clock=clock),
        routes,
        metrics,
        on_fatal,
        name=name,
        transactional=transactional_id is not None,
        unconfirmed=unconfirmed,
        commit_interval_s=commit_interval_s,
        flush_timeout_s=max(1.0, settings.shutdown_timeout_s - 10.0),
        backoff=(settings.retry_backoff_s, settings.retry_backoff_max_s),
        give_up_s=settings.retry_give_up_s,
        clock=clock,
        make_producer=new_producer,
        settle=settle,
        ledger=ledger,
        shared_id=shared_id,
    )
    built.append(forwarder)
    return forwarder
