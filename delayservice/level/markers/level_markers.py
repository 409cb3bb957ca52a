"""Cancel and reschedule of level messages in one daemon process: the book of markers,
the gate the forwarders wait on, and the thread that reads both topics.

The daemon runs one `LevelMarkers` beside its level workers (it is one of the daemon's
workers: started first, stopped with them, its health part of readiness) and gives
each level worker its own side of it (`for_worker`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from delayservice.level.markers.actions import LEAD_MS, WorkerMarkers
from delayservice.level.markers.book import MarkerBook
from delayservice.level.markers.gate import MarkerGate
from delayservice.level.markers.reader import MakeConsumer, MarkerReader
from delayservice.level.memory_budget import MemoryBudget
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.settings import Settings

BOOK_SHARE: Final = 0.25
"""The share of the memory budget the book of markers may take (at about 100 bytes a
marker, 768 MiB gives it about two million); the held records have the rest."""


class LevelMarkers:
    def __init__(
        self,
        settings: Settings,
        metrics: ServiceMetrics,
        now_ms: Callable[[], int],
        make_consumer: MakeConsumer | None = None,
        budget: MemoryBudget | None = None,
    ) -> None:
        """`now_ms`: the clock the forwarders meet due times by (the broker's, held
        back), so the gate and the due times compare. `budget`: the process's memory
        budget, which counts the book and gives it `BOOK_SHARE` (None: unbounded)."""
        self.settings = settings
        share = None if budget is None else int(budget.max_bytes * BOOK_SHARE)
        self.book = MarkerBook(settings.level_set(), max_bytes=share)
        if budget is not None:
            budget.register(self.book)
        self.gate = MarkerGate(LEAD_MS)
        self._metrics = metrics
        self._now_ms = now_ms
        extra: dict[str, Any] = {} if make_consumer is None else {"make_consumer": make_consumer}
        self._workers: list[WorkerMarkers] = []
        self.reader = MarkerReader(
            settings, self.book, self.gate, metrics, now_ms, on_pass=self._nudge, **extra
        )
        self.name = self.reader.name

    def _nudge(self) -> None:
        """After each pass of the reader: wake the forwarders with markers to serve."""
        for worker in self._workers:
            worker.nudge()

    def for_worker(self, worker: str, *, transactional: bool) -> WorkerMarkers:
        side = WorkerMarkers(
            worker,
            self.book,
            self.gate,
            self.settings.level_set(),
            self.settings.markers_outcomes_topic,
            self._metrics,
            self._now_ms,
            transactional=transactional,
            cancel_lead_ms=self.settings.cancel_lead_ms,
        )
        self._workers.append(side)
        return side

    def start(self) -> None:
        self.reader.start()

    def request_stop(self) -> None:
        self.reader.request_stop()

    def join(self, timeout: float) -> bool:
        return self.reader.join(timeout)

    def health(self) -> tuple[bool, str]:
        return self.reader.health()
