"""One /metrics for several worker processes, shaped as if one daemon exported it.

With `processes = N` each worker serves its own registry on a loopback port. The
supervisor's endpoint scrapes them and merges series with equal names and labels, so
dashboards, alert rules and `on (instance, level)` joins work unchanged: counters and
histograms add up, and so do gauges of amounts (buffered records, lag, partitions,
memory). Gauges that are a state or a bound are combined the way an operator reads
them: ready only if every worker is (min); the longest pause, the clock offset and a
level's delay are the worst or only value (max).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

GAUGE_MIN = frozenset({"delayservice_ready"})
GAUGE_MAX = frozenset(
    {
        "delayservice_longest_pause_seconds",
        "delayservice_clock_offset_seconds",
        "delayservice_clock_hold_back_seconds",
        "delayservice_level_delay_seconds",
    }
)


def _combine(family: str, kind: str, sample_name: str, a: float, b: float) -> float:
    if sample_name.endswith("_created"):
        return min(a, b)  # the series exists since the earliest worker created it
    if kind == "gauge" and family in GAUGE_MIN:
        return min(a, b)
    if kind == "gauge" and family in GAUGE_MAX:
        return max(a, b)
    return a + b


def merge(expositions: Iterable[str]) -> list[Metric]:
    """Merge Prometheus text expositions; a family keeps the first worker's help and type."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in expositions:
        for parsed in text_string_to_metric_families(text):
            family = families.get(parsed.name)
            if family is None:
                family = families[parsed.name] = Metric(
                    parsed.name, parsed.documentation, parsed.type, parsed.unit
                )
                values[parsed.name] = {}
            series = values[parsed.name]
            for sample in parsed.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                old = series.get(key)
                series[key] = (
                    sample.value
                    if old is None
                    else _combine(parsed.name, family.type, sample.name, old, sample.value)
                )
    for name, family in families.items():
        family.samples = [
            Sample(sample_name, dict(labels), value)
            for (sample_name, labels), value in values[name].items()
        ]
    return list(families.values())


class MergedCollector(Collector):
    """Collects by calling `scrape()` for the workers' current expositions."""

    def __init__(self, scrape: Callable[[], list[str]]) -> None:
        self._scrape = scrape

    def collect(self) -> Iterator[Metric]:
        yield from merge(self._scrape())
