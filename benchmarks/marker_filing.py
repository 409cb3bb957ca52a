"""How fast the level markers reader files a flood, in one process with no broker:
`--markers` well-formed cancels of no message, all on markers partition 0 and naming
level partition 0, as records the consumer would return, through `MarkerFiling.read`
(decoding, refusals, placing, the book's columns) a batch of 1,000 at a time.

What a flood costs the reader per marker, apart from the owner's look at each and the
broker: the figure that bounds how soon a flooded partition's records may go
(docs/cancel-and-reschedule.md, "Not done yet").

    python benchmarks/marker_filing.py --markers 200000
    python benchmarks/marker_filing.py --markers 100000 --profile   # where the time goes
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from confluent_kafka import TIMESTAMP_CREATE_TIME, Message
from prometheus_client import CollectorRegistry

from delayservice.envelope import H_CANCEL
from delayservice.level.markers.book import MarkerBook
from delayservice.level.markers.filing import MarkerFiling
from delayservice.level.markers.gate import MarkerGate
from delayservice.markers.level_ids import level_id
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.settings_loading import load_settings

BATCH = 1000
PARTITIONS = 3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markers", type=int, default=200_000)
    parser.add_argument("--profile", action="store_true", help="print the top functions")
    args = parser.parse_args()
    settings = load_settings(levels="2s,3s,5s", bootstrap_servers="127.0.0.1:9")
    levels = settings.level_set()
    now = int(time.time() * 1000)
    book, gate = MarkerBook(levels), MarkerGate(1000)
    gate.markers_count(PARTITIONS, now)
    for level in levels:
        book.partition_count(level.topic, PARTITIONS)
    filing = MarkerFiling(
        settings.markers_topic,
        [level.topic for level in levels],
        book,
        gate,
        ServiceMetrics(CollectorRegistry()),
        lambda: now,
        {},
    )
    records = [
        Message(
            topic=settings.markers_topic,
            partition=0,
            offset=n,
            headers=[(H_CANCEL, level_id(1 + n % len(levels), 0, now).encode())],
            timestamp=(TIMESTAMP_CREATE_TIME, now),
        )
        for n in range(args.markers)
    ]
    profile = cProfile.Profile() if args.profile else None
    began = time.perf_counter()
    if profile is not None:
        profile.enable()
    for start in range(0, len(records), BATCH):
        filing.read(None, records[start : start + BATCH])
    if profile is not None:
        profile.disable()
    took = time.perf_counter() - began
    kept = sum(book.kept().values())
    print(
        f"{args.markers:,} markers filed in {took:.2f} s: {took / args.markers * 1e6:.1f} µs "
        f"each, {args.markers / took:,.0f} a second ({kept:,} kept, "
        f"{book.total_bytes / max(kept, 1):.0f} B each as the book counts them)"
        + (" (profiled: slower)" if profile is not None else "")
    )
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
