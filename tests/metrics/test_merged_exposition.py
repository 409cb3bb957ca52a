"""Workers' expositions merge into one that reads like a single daemon's."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from delayservice.metrics.merged_exposition import MergedCollector, merge
from delayservice.metrics.service_metrics import ServiceMetrics


def _worker(forwarded: int, ready: float, pause: float, buffered: int, late: list[float]) -> str:
    registry = CollectorRegistry()
    metrics = ServiceMetrics(registry)
    metrics.forwarded.labels("1s").inc(forwarded)
    metrics.ready.set(ready)
    metrics.longest_pause.labels("1s").set(pause)
    metrics.buffered_messages.labels("1s").set(buffered)
    metrics.lateness.observe_many("1s", late)
    return generate_latest(registry).decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_amounts_add_up_states_take_the_worst_and_the_shape_is_one_daemons():
    a = _worker(10, 1.0, 0.0, 5, [0.001, 0.2])
    b = _worker(32, 0.0, 7.5, 3, [0.004])
    registry = CollectorRegistry()
    registry.register(MergedCollector(lambda: [a, b]))
    merged = _samples(generate_latest(registry).decode())

    level = (("level", "1s"),)
    assert merged[("delayservice_forwarded_total", level)] == 42
    assert merged[("delayservice_buffered_messages", level)] == 8
    assert merged[("delayservice_lateness_seconds_count", level)] == 3
    assert merged[("delayservice_lateness_seconds_sum", level)] == 0.001 + 0.2 + 0.004
    assert merged[("delayservice_ready", ())] == 0  # ready only if every worker is
    assert merged[("delayservice_longest_pause_seconds", level)] == 7.5
    assert set(merged) == set(_samples(a))  # same series as one daemon: no extra labels


def test_a_worker_that_does_not_answer_leaves_the_others_merged():
    a = _worker(10, 1.0, 0.0, 5, [])
    families = {f.name: f for f in merge([a])}
    assert "delayservice_forwarded" in families
    assert merge([]) == []
