"""A labelled Prometheus histogram fed in batches.

prometheus-client's Histogram takes two locks and scans its buckets per observation;
at tens of thousands of forwards a second that is a measurable share of the daemon's
CPU. Lateness is known when a record is sent, so it is kept until its commit point and
folded in here at once: one lock and a C bisect per value, or per run of forwards late
by the same time (`observe_counted`).
The exported series are the same: `_bucket`, `_sum` and `_count`.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector


class _Series:
    __slots__ = ("counts", "sum")

    def __init__(self, size: int) -> None:
        self.counts = [0] * size
        self.sum = 0.0


class BatchHistogram(Collector):
    def __init__(
        self,
        name: str,
        documentation: str,
        label: str,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.label = label
        self.bounds = [float(b) for b in buckets]
        self._lock = threading.Lock()
        self._series: dict[str, _Series] = {}
        registry.register(self)

    def labels(self, value: str) -> None:
        """Export the series at zero from now on."""
        with self._lock:
            self._series.setdefault(value, _Series(len(self.bounds) + 1))

    def observe_many(self, value: str, amounts: Iterable[float]) -> None:
        bounds, locate = self.bounds, bisect.bisect_left
        with self._lock:
            series = self._series.setdefault(value, _Series(len(bounds) + 1))
            counts, total = series.counts, 0.0
            for amount in amounts:
                counts[locate(bounds, amount)] += 1
                total += amount
            series.sum += total

    def observe_counted(self, value: str, counted: Iterable[tuple[float, int]]) -> None:
        """Observe each (amount, n): `n` observations of `amount`, so that many forwards
        late by the same time cost one bisect."""
        bounds, locate = self.bounds, bisect.bisect_left
        with self._lock:
            series = self._series.setdefault(value, _Series(len(bounds) + 1))
            counts, total = series.counts, 0.0
            for amount, n in counted:
                counts[locate(bounds, amount)] += n
                total += amount * n
            series.sum += total

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label])
        with self._lock:
            snapshot = [(v, list(s.counts), s.sum) for v, s in self._series.items()]
        for value, counts, total in snapshot:
            cumulative, running = [], 0
            for bound, count in zip([*self.bounds, float("inf")], counts, strict=True):
                running += count
                cumulative.append((_le(bound), running))
            family.add_metric([value], cumulative, total)
        yield family

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=[self.label])


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)
