"""Far-future precise messages on a real broker: kept in span files with nothing in
memory, split into slot files as they come near, and forwarded on time."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.precise.test_precise_daemon import (
    _append_times,
    _exact_producer,
    _headers,
    _precise,
    _precise_worker,
)

pytestmark = pytest.mark.kafka

HORIZON_S = 10  # tiers of 1 s, 10 s, 240 s and 7,680 s


def _files(root: Path, suffix: str) -> list[tuple[int, int]]:
    """(first second, width) of every slot or span file under `root`."""
    out = []
    for path in root.rglob(f"*{suffix}"):
        name = path.name.removesuffix(suffix)
        start, _, width = name.partition("_")
        out.append((int(start), int(width or 1)))
    return sorted(out)


def test_a_year_out_waits_in_a_span_and_a_near_span_is_split_and_sent_on_time(
    testbed: Any, tmp_path: Path
) -> None:
    # All three on the precise topic's wheel: this is about its tiers, not the far topic.
    settings = _precise(testbed, tmp_path, precise_horizon_s=HORIZON_S, precise_far_after="366d")
    assert settings.max_delay_ms == 366 * 86_400_000  # a year by default
    target = testbed.create_topic(f"tiers-{testbed.tag}")
    daemon = testbed.start_daemon(settings)
    testbed.wait_assigned(daemon, partitions=settings.partitions)
    worker = _precise_worker(daemon)
    producer = _exact_producer(testbed, settings)
    started = time.time()
    year = producer.produce(target, b"a year", deliver_at=started + 365 * 86_400)
    later = producer.produce(target, b"an hour and a half", delay=5_430)
    near_delay = 40.0  # beyond the horizon: a span first, a slot file later
    near = producer.produce(target, b"soon", delay=near_delay)
    assert producer.flush(10) == 0
    appended = _append_times(testbed, settings, 3)
    root = settings.data_dir / settings.precise_topic

    testbed.wait_for(lambda: worker.wheel.disk_slots == 3, 10, "three span files")
    assert _files(root, ".slot") == []
    spans = _files(root, ".span")
    assert len(spans) == 3, spans
    assert max(width for _, width in spans) == 7_680
    assert worker.wheel.loaded_slots == 0
    assert len(worker.wheel.buffer) == 0
    assert worker.wheel.held_bytes == 0

    (record,) = testbed.collect(target, 1, timeout=near_delay + 30)
    assert _headers(record)["delay-id"].decode() == near
    due_ms = appended[near] + int(near_delay * 1000)
    lateness = record.timestamp()[1] - due_ms
    assert 0 <= lateness < 1000, lateness
    # The other two are still on disk, in spans, and nothing of them is in memory.
    testbed.wait_for(lambda: worker.wheel.disk_slots == 2, 10, "the near slot deleted")
    assert _files(root, ".slot") == []
    assert len(_files(root, ".span")) == 2
    assert worker.wheel.loaded_slots == 0
    assert worker.wheel.held_bytes == 0
    assert {year, later} <= set(appended)
