from random import Random

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from delayservice.metrics.batch_histogram import BatchHistogram

BUCKETS = (0.005, 0.1, 1.0, 5.0)


def _samples(registry):
    return sorted(
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    )


def _same_samples(ours, theirs):
    """Equal names, labels and counts; sums equal up to the order floats were added in."""
    ours, theirs = _samples(ours), _samples(theirs)
    assert [(n, labels) for n, labels, _ in ours] == [(n, labels) for n, labels, _ in theirs]
    for (name, _, mine), (_, _, reference) in zip(ours, theirs, strict=True):
        if name.endswith("_sum"):
            assert mine == pytest.approx(reference, rel=1e-12)
        else:
            assert mine == reference


def test_it_exports_what_the_client_library_histogram_exports():
    random = Random(20261126)
    values = [random.choice([0.0, 0.005, 0.1, 1.0, 5.0, 7.5]) for _ in range(500)]
    values += [random.uniform(0, 10) for _ in range(500)]
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    batch = BatchHistogram("lat_seconds", "doc", "level", BUCKETS, ours)
    reference = Histogram("lat_seconds", "doc", ["level"], buckets=BUCKETS, registry=theirs)
    batch.observe_many("5s", values[:300])
    batch.observe_many("5s", values[300:])
    for value in values:
        reference.labels("5s").observe(value)
    _same_samples(ours, theirs)
    assert b'lat_seconds_bucket{le="+Inf",level="5s"} 1000.0' in generate_latest(ours)


def test_labels_exports_a_zero_series():
    registry = CollectorRegistry()
    BatchHistogram("lat_seconds", "doc", "level", BUCKETS, registry).labels("1m")
    assert registry.get_sample_value("lat_seconds_count", {"level": "1m"}) == 0
    assert registry.get_sample_value("lat_seconds_bucket", {"level": "1m", "le": "+Inf"}) == 0


def test_counted_observations_equal_as_many_single_ones():
    registry, other = CollectorRegistry(), CollectorRegistry()
    counted = BatchHistogram("lateness_seconds", "doc", "level", [0.01, 0.1, 1.0], registry)
    single = BatchHistogram("lateness_seconds", "doc", "level", [0.01, 0.1, 1.0], other)
    pairs = [(0.005, 3), (0.05, 2), (0.5, 1), (5.0, 4)]
    counted.observe_counted("5s", pairs)
    single.observe_many("5s", [amount for amount, n in pairs for _ in range(n)])
    _same_samples(registry, other)
