"""What the level marker book costs per marker kept, in one process: file `--markers`
well-formed cancels whose ids name real level partitions and no message (a flood's
markers), answer each as its owner would, and read the bytes the Python allocator holds
for them (tracemalloc) and the growth of the process's RSS.

    python benchmarks/marker_book_memory.py --markers 100000
    python benchmarks/marker_book_memory.py --markers 1000000 --no-trace   # RSS only
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from pathlib import Path

from delayservice.level.markers.book import Action, MarkerBook
from delayservice.level.markers.verdict import LevelMarker
from delayservice.levels import LevelSet
from delayservice.markers.level_ids import level_id
from delayservice.markers.replies import CANCEL, reply_key

LEVELS = LevelSet.parse("5s,30s,1m,5m,10m,30m,1h,2h")
TOPIC = "delay_markers"


def rss() -> int:
    fields = Path("/proc/self/statm").read_text().split()
    return int(fields[1]) * 4096


def run(count: int, trace: bool, partitions: int = 12) -> dict[str, float]:
    now = int(time.time() * 1000)
    gc.collect()
    if trace:
        tracemalloc.start()
    before, rss_before = (tracemalloc.get_traced_memory()[0] if trace else 0), rss()
    book = MarkerBook(LEVELS)
    for each in LEVELS.levels:
        book.partition_count(each.topic, partitions)
    for n in range(count):  # as the reader makes them: each its own id string and key
        message_id = level_id(1 + n % len(LEVELS.levels), n % partitions, now)
        book.file(LevelMarker(CANCEL, message_id, now, TOPIC, n % 4, n // 4))
    filed = (tracemalloc.get_traced_memory()[0] if trace else 0) - before
    rss_filed = rss() - rss_before
    for n in range(0, count, 1000):  # the owner answers them, an interval at a time
        keys = [reply_key(TOPIC, k % 4, k // 4) for k in range(n, min(count, n + 1000))]
        book.apply(Action(answers=[(key, "unmatched") for key in keys]))
    answered = (tracemalloc.get_traced_memory()[0] if trace else 0) - before
    rss_answered = rss() - rss_before
    counted = book.measure() if hasattr(book, "measure") else 0
    return {
        "filed B/marker (tracemalloc)": filed / count,
        "answered B/marker (tracemalloc)": answered / count,
        "filed B/marker (RSS)": rss_filed / count,
        "answered B/marker (RSS)": rss_answered / count,
        "counted B/marker (book's own count)": counted / count,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--markers", type=int, default=100_000)
    parser.add_argument("--no-trace", action="store_true", help="RSS only (faster)")
    args = parser.parse_args()
    for name, value in run(args.markers, not args.no_trace).items():
        print(f"{args.markers:>9,} markers  {name:<38} {value:8.1f}")


if __name__ == "__main__":
    main()
