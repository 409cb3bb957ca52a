"""Precise mode's pending figures as gauges: a census of the data directory, retaken
in the background.

The wheel does not count records per file (it need not, to forward them), so the
figures come from reading the files, as `delayservice pending` does. A census of a
million held records (504 files, 207 MB) took 3.2 s of CPU here, so the next one waits
`SHARE` times as long as the last took, at least `INTERVAL_S`: at most about 5% of one
core, whatever the data directory holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Container
from pathlib import Path

from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.precise.storage import due_buckets
from delayservice.precise.storage.census import Census, take_census

log = logging.getLogger(__name__)

INTERVAL_S = 30.0
SHARE = 20


class CensusExport:
    def __init__(
        self,
        root: Path,
        cancels: Container[str],
        metrics: ServiceMetrics,
        level_name: str,
        interval_s: float = INTERVAL_S,
    ) -> None:
        self._root = root
        self._cancels = cancels
        self._interval = interval_s
        self._metrics = metrics
        self._level = level_name
        self._taken = 0.0
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"precise-census-{level_name}", daemon=True
        )
        metrics.precise_census_age.labels(level_name).set_function(
            lambda: time.monotonic() - self._taken if self._taken else 0.0
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self.take()
            except Exception:  # a surprise on disk: the next census tries again
                log.exception("census of %s failed; retrying", self._root)
            took = time.monotonic() - started
            self._stopping.wait(max(self._interval, SHARE * took))

    def take(self) -> Census:
        now_ms = int(time.time() * 1000)
        census = take_census(self._root, now_ms, self._cancels)
        gauge = self._metrics.precise_pending
        for copy, counts in (("owner", census.owner), ("replica", census.replica)):
            for due in due_buckets.NAMES:
                gauge.labels(self._level, copy, due).set(counts[due])
        earliest = census.earliest_due_ms
        self._metrics.next_due.labels(self._level).set(earliest / 1000 if earliest else 0.0)
        overdue = max(0.0, (now_ms - earliest) / 1000) if earliest else 0.0
        self._metrics.oldest_overdue.labels(self._level).set(overdue)
        self._taken = time.monotonic()
        return census
