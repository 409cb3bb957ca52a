"""Precise mode memory: what millions of pending messages cost the daemon, in RAM and on disk.

`--messages` exact messages (default 5,000,000) of `--value-bytes` are produced with
`deliver_at` drawn uniformly from now + `--from-s` to now + `--to-s` (default 1 h to
25 h), so none falls due during the run. The daemon runs as `python -m delayservice
run` in its own process, and is measured from outside:

1. started on the empty precise topic, sampled for `--settle` seconds: RSS before;
   then stopped;
2. the messages are produced by `--producers` processes (linger.ms 50, 1 MB batches,
   lz4), with the daemon down so that step 3 times the intake alone;
3. the daemon is started again on the same data directory; intake is complete once
   the committed offsets of its group (`{group_id}-precise-0`) reach the topic's end
   offsets. RSS is sampled every 0.25 s; RSS after is sampled `--settle` seconds later.

Reported: RSS before, peak and after, RSS per pending message, the intake rate, the
slot files and bytes on disk (counted in the data directory, and as /metrics says).
Target: RSS under 300 MiB at 5,000,000 pending.

    python benchmarks/precise_memory.py [--messages 5000000] [--producers 2]
    python benchmarks/precise_memory.py --messages 1000000      # a quicker run
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from daemon_process import metrics_port, scrape, series_sum
from forwarding import broker
from precise_burst import fast_producer
from precise_common import (
    MiB,
    RssSampler,
    Ticker,
    committed,
    create_topics,
    data_dir,
    end_offsets,
    load,
    logged_daemon,
    precise_settings,
    report_log,
    stderr,
    tag_for,
    vm_rss,
)

from delayservice.settings import Settings

GiB = 1024 * MiB
TARGET_RSS = 300 * MiB


def produce_share(
    settings: Settings,
    target: str,
    count: int,
    window: tuple[float, float],
    size: int,
    seed: int,
    done: Any,
) -> None:
    """Child: `count` messages due uniformly within `window` (seconds from now)."""
    producer = fast_producer(settings)
    rng = random.Random(seed)
    value = b"m" * size
    now = time.time()
    low, high = now + window[0], now + window[1]
    for i in range(count):
        while True:
            try:
                producer.produce(target, value, deliver_at=rng.uniform(low, high))
                break
            except BufferError:
                producer.poll(0.05)
        if i % 5_000 == 0:
            producer.poll(0)
            done.value = i
    if producer.flush(300) != 0:
        raise SystemExit("the producer could not deliver every message")
    done.value = count


def produce_all(settings: Settings, target: str, args: argparse.Namespace) -> float:
    """Produce from `args.producers` processes; returns the seconds it took."""
    context = multiprocessing.get_context("spawn")
    shares = [
        args.messages // args.producers + (i < args.messages % args.producers)
        for i in range(args.producers)
    ]
    counters = [context.Value("q", 0, lock=False) for _ in shares]
    children = [
        context.Process(
            target=produce_share,
            args=(
                settings,
                target,
                share,
                (args.from_s, args.to_s),
                args.value_bytes,
                args.seed + i,
                counter,
            ),
        )
        for i, (share, counter) in enumerate(zip(shares, counters, strict=True))
    ]
    started = time.monotonic()
    for child in children:
        child.start()
    tick = Ticker(5.0)
    while any(child.is_alive() for child in children):
        time.sleep(0.5)
        done = sum(counter.value for counter in counters)
        elapsed = time.monotonic() - started
        tick(
            f"  produced {done:,} of {args.messages:,} in {elapsed:.0f} s "
            f"({done / max(elapsed, 0.001):,.0f} msg/s); {load()}"
        )
    for child in children:
        child.join()
        if child.exitcode != 0:
            raise SystemExit(f"a producer process failed with exit code {child.exitcode}")
    return time.monotonic() - started


def settle_rss(pid: int, seconds: float) -> int:
    """The largest of a few RSS samples over `seconds`."""
    samples = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append(vm_rss(pid) or 0)
        time.sleep(0.25)
    return max(samples, default=vm_rss(pid) or 0)


def on_disk(root: Path) -> tuple[int, int]:
    """(slot and span files, their bytes) under the data directory."""
    files = size = 0
    for directory, _, names in os.walk(root):
        for name in names:
            if name.endswith((".slot", ".span")):
                files += 1
                size += (Path(directory) / name).stat().st_size
    return files, size


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--messages", type=int, default=5_000_000, help="pending messages")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--from-s", type=float, default=3600.0, help="earliest due, from now")
    parser.add_argument("--to-s", type=float, default=25 * 3600.0, help="latest due, from now")
    parser.add_argument("--producers", type=int, default=2, help="producer processes")
    parser.add_argument("--partitions", type=int, default=3, help="of the precise topic")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds of RSS sampling")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--intake-timeout", type=float, default=3600.0, help="seconds")
    parser.add_argument("--bootstrap", help="an existing broker instead of a local one")
    args = parser.parse_args()

    log_path = Path(f"/tmp/precise-memory-{int(time.time())}.log")
    stderr(f"start: {load()}; daemon log in {log_path}")
    n = args.messages
    with broker(args.bootstrap) as bootstrap, data_dir("memory") as root:
        tag = tag_for("memory")
        max_delay = f"{math.ceil(args.to_s / 86400) + 1}d"
        settings = precise_settings(
            bootstrap, tag, root, partitions=args.partitions, max_delay=max_delay
        )
        topic, group = settings.precise_topic, f"{settings.group_id}-precise-0"
        target = f"{tag}-target"
        create_topics(settings, [target], 3)

        with logged_daemon(settings, tag, log_path) as daemon:
            before = settle_rss(daemon.pid, args.settle)
        stderr(f"idle daemon: {before / MiB:.0f} MiB RSS; producing {n:,} messages")

        produce_s = produce_all(settings, target, args)
        ends = end_offsets(bootstrap, topic)
        if sum(ends.values()) < n:
            raise SystemExit(f"only {sum(ends.values()):,} of {n:,} records on {topic}")
        stderr(f"produced {n:,} in {produce_s:.0f} s; starting the daemon for the intake")

        started = time.monotonic()
        with logged_daemon(settings, tag, log_path, ready_within=300) as daemon:
            ready_s = time.monotonic() - started
            with RssSampler(daemon.pid) as rss:
                tick = Ticker(5.0)
                marks: dict[int, float] = {}  # percent of the backlog -> seconds
                by_mark: dict[int, int] = {}  # percent -> RSS then
                while True:
                    done = sum(committed(bootstrap, group, topic, ends).values())
                    elapsed = time.monotonic() - started
                    for mark in (10, 25, 50, 75, 90):
                        if mark not in marks and done * 100 >= mark * n:
                            marks[mark] = elapsed
                            by_mark[mark] = vm_rss(daemon.pid) or 0
                    if done >= n:
                        break
                    if elapsed > args.intake_timeout or daemon.poll() is not None:
                        raise SystemExit(f"intake stopped at {done:,} of {n:,}")
                    tick(
                        f"  intake {done:,} of {n:,} in {elapsed:.0f} s "
                        f"({done / elapsed:,.0f} msg/s), RSS "
                        f"{(vm_rss(daemon.pid) or 0) / MiB:.0f} MiB; {load()}"
                    )
                    time.sleep(0.5)
                intake_s = time.monotonic() - started
                after = settle_rss(daemon.pid, args.settle)
            peak = rss.peak
            metrics = scrape(metrics_port(daemon.pid))
        files, size = on_disk(root)

    steady = 0.8 * n / (marks[90] - marks[10]) if 10 in marks and 90 in marks and n >= 10 else 0.0
    on_disk_metric = series_sum(metrics, "delayservice_precise_slot_files", state="on_disk")
    loaded_metric = series_sum(metrics, "delayservice_precise_slot_files", state="loaded")
    bytes_metric = series_sum(metrics, "delayservice_precise_disk_bytes")
    buffered = series_sum(metrics, "delayservice_buffered_messages", level="exact")
    buffered += max(0.0, series_sum(metrics, "delayservice_buffered_messages", level="exact-far"))
    print(
        f"\n{n:,} pending exact messages of {args.value_bytes} B, due uniformly over now + "
        f"{args.from_s / 3600:g} h .. now + {args.to_s / 3600:g} h, precise topic of "
        f"{args.partitions} partitions; daemon in its own process"
    )
    print(
        f"produce time         : {produce_s:.0f} s ({n / produce_s:,.0f} msg/s, "
        f"{args.producers} processes, linger.ms 50, lz4)"
    )
    print(
        f"intake               : {intake_s:.1f} s from the daemon's start "
        f"({n / intake_s:,.0f} msg/s; ready after {ready_s:.1f} s); "
        f"{steady:,.0f} msg/s between 10% and 90%"
    )
    print(f"RSS before (idle)    : {before / MiB:.0f} MiB")
    during = ", ".join(f"{m}% {by_mark[m] / MiB:.0f} MiB" for m in sorted(by_mark))
    print(f"RSS during intake    : {during}; peak {peak / MiB:.0f} MiB")
    print(
        f"RSS after            : {after / MiB:.0f} MiB "
        f"(target < {TARGET_RSS / MiB:.0f} MiB at 5,000,000)"
    )
    print(
        f"RSS per pending msg  : {(after - before) / n:.1f} B above idle ({after / n:.1f} B in all)"
    )
    most = args.partitions * settings.max_delay_ms // 1000
    print(
        f"RSS per slot file    : {(after - before) / max(files, 1):.0f} B above idle; the "
        f"wheel keeps state per slot file, and there can be up to partitions x max_delay "
        f"seconds of them ({most:,} here)"
    )
    print(
        f"on disk              : {files:,} slot files, {size / MiB:,.0f} MiB "
        f"({size / n:.0f} B per message)"
    )
    print(
        f"/metrics             : slot files on_disk {on_disk_metric:,.0f}, loaded "
        f"{loaded_metric:,.0f}; disk bytes {bytes_metric / MiB:,.0f} MiB; "
        f"buffered {buffered:,.0f}"
    )
    problems = report_log(log_path)
    print(
        f"\nsummary: {n:,} pending over {(args.to_s - args.from_s) / 3600:g} h: RSS "
        f"{before / MiB:.0f} -> {after / MiB:.0f} MiB (peak {peak / MiB:.0f}; "
        f"{(after - before) / n:.1f} B per message, {(after - before) / max(files, 1):.0f} B "
        f"per slot file), {files:,} slot files, {size / GiB:.2f} GiB on disk, intake "
        f"{n / intake_s:,.0f} msg/s; {problems} daemon log warnings"
    )
    stderr(f"end: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
