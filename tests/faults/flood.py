"""A flood of well-formed cancel markers for messages that do not exist, as a batch job
cancelling reminders that already went, or a client that misbehaves, would write them.

Used by the flood fault row (tests/faults/test_marker_flood_faults.py) and by
benchmarks/marker_flood.py, so both meet the same markers."""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import Producer

from delayservice.envelope import H_CANCEL, H_VERSION, VERSION
from delayservice.markers.level_ids import level_id, marker_partition


class Flood:
    """Writes `count` cancel markers with ids that name real level partitions (level
    partition `only`, or each in turn) and a current send time, but no message. Each
    lands on the markers partition the SDK would choose for its id. `written` counts
    the markers handed to the client so far; `error`, what stopped a flood run on its
    own thread (`start`)."""

    def __init__(self, settings: Any, count: int, only: int | None = None) -> None:
        self.settings = settings
        self.count = count
        self.only = only
        self.written = 0
        self.seconds = float("nan")
        self.error: BaseException | None = None

    def run(self) -> float:
        """Writes the flood and waits until the broker has it; returns the seconds."""
        settings = self.settings
        producer = Producer(
            {
                "bootstrap.servers": settings.bootstrap_servers,
                "linger.ms": 20,
                "batch.size": 1_000_000,
                "queue.buffering.max.messages": 1_000_000,
            }
        )
        meta = producer.list_topics(settings.markers_topic, timeout=10)
        markers = len(meta.topics[settings.markers_topic].partitions)
        levels = list(settings.level_set())
        start = time.monotonic()
        for n in range(self.count):
            level = levels[n % len(levels)]
            partition = n % settings.partitions if self.only is None else self.only
            message_id = level_id(level.index, partition)
            headers: list[tuple[str, str | bytes | None]] = [
                (H_VERSION, str(VERSION).encode()),
                (H_CANCEL, message_id.encode()),
            ]
            where = marker_partition(message_id, markers)
            while True:
                try:
                    producer.produce(settings.markers_topic, None, None, where, headers=headers)
                    break
                except BufferError:
                    producer.poll(0.05)
            self.written = n + 1
            if n % 10_000 == 0:
                producer.poll(0)
        left = producer.flush(300)
        if left:
            raise RuntimeError(f"{left} flood markers not acknowledged in 300 s")
        self.seconds = time.monotonic() - start
        return self.seconds

    def start(self) -> threading.Thread:
        """The flood on a thread of its own (joined by the caller, who checks `error`)."""
        thread = threading.Thread(target=self._run_noting, name="marker-flood", daemon=True)
        thread.start()
        return thread

    def _run_noting(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # the caller's thread reports it
            self.error = exc
