"""Precise mode burst: N messages all due at the same instant, how late does the tail go out?

`--messages` exact messages (default 500,000) are produced with one `deliver_at`, a
whole second `--ahead` seconds after the run starts, far enough that all are written
before it. The daemon runs as `python -m delayservice run` in its own process; its RSS
is sampled from /proc throughout. Afterwards this process reads the precise topic and
the target (both LogAppendTime) and joins them by `delay-id`:

    due      = max(precise-topic append time + delay-ms, delay-due-ms)
    lateness = append time on the target - due      (negative = early)

Reported: lateness p50 / p99 / max, time from due to the first and the last arrival,
how many went out within 1 s of due, the drain rate, and the daemon's peak RSS. The
issue to compare against: RocketMQ 5 forwarded about 20,000 of a 500,000 burst on time
and the rest 31 s or more late (apache/rocketmq#6566).

    python benchmarks/precise_burst.py [--messages 500000] [--ahead 75] [--max-buffered-mib 256]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from forwarding import broker
from precise_common import (
    MetricsSampler,
    MiB,
    RssSampler,
    Ticker,
    cpu_seconds,
    create_topics,
    data_dir,
    due_ms,
    join,
    load,
    logged_daemon,
    pct,
    precise_settings,
    read_topic,
    report_log,
    stderr,
    tag_for,
    vm_rss,
    wait_for_count,
    wait_for_ids,
)

from delayservice.producer import DelayProducer
from delayservice.settings import Settings

TARGET_PARTITIONS = 6
BUFFERED = 'delayservice_buffered_messages{level="exact"}'
ROCKETMQ_ON_TIME = 20_000
ROCKETMQ_LATE_S = 31


def fast_producer(settings: Settings) -> DelayProducer:
    return DelayProducer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
        },
        settings=settings,
        precision="exact",
    )


def produce_burst(settings: Settings, target: str, count: int, at: float, size: int) -> float:
    """`count` messages due at `at`; returns the seconds it took, flush included."""
    producer = fast_producer(settings)
    value = b"b" * size
    tick = Ticker(5.0)
    started = time.monotonic()
    for i in range(count):
        while True:
            try:
                producer.produce(target, value, str(i).encode(), deliver_at=at)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
            tick(f"  produced {i:,} of {count:,}; due in {at - time.time():.0f} s")
    if producer.flush(120) != 0:
        raise SystemExit("the producer could not deliver every message")
    return time.monotonic() - started


def rel(moment: float | None, at: float) -> str:
    """`moment` against the due time, in words."""
    if moment is None:
        return "never"
    return f"{abs(moment - at):.1f} s {'before' if moment < at else 'after'} due"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--messages", type=int, default=500_000, help="size of the burst")
    parser.add_argument(
        "--ahead", type=float, default=75.0, help="seconds from the start to the due time"
    )
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=3, help="of the precise topic")
    parser.add_argument(
        "--lookahead", type=float, default=5.0, help="the daemon's precise_lookahead_s"
    )
    parser.add_argument(
        "--max-buffered-mib",
        type=int,
        default=None,
        help="the daemon's max_buffered_bytes, in MiB (default: the setting's default)",
    )
    parser.add_argument(
        "--guarantee",
        choices=["at-least-once", "exactly-once"],
        default="at-least-once",
        help="the daemon's guarantee (targets are read read_committed)",
    )
    parser.add_argument("--bootstrap", help="an existing broker instead of a local one")
    args = parser.parse_args()

    log_path = Path(f"/tmp/precise-burst-{int(time.time())}.log")
    stderr(f"start: {load()}; daemon log in {log_path}")
    with broker(args.bootstrap) as bootstrap, data_dir("burst") as root:
        tag = tag_for("burst")
        settings = precise_settings(
            bootstrap,
            tag,
            root,
            partitions=args.partitions,
            precise_lookahead_s=args.lookahead,
            guarantee=args.guarantee,
            **(
                {"max_buffered_bytes": args.max_buffered_mib * MiB} if args.max_buffered_mib else {}
            ),
        )
        target = f"{tag}-target"
        create_topics(settings, [target], TARGET_PARTITIONS)
        with logged_daemon(settings, tag, log_path) as daemon:
            idle_rss = vm_rss(daemon.pid) or 0
            at = math.ceil(time.time() + args.ahead)
            with RssSampler(daemon.pid) as rss, MetricsSampler(daemon.pid, [BUFFERED]) as held:
                stderr(f"producing {args.messages:,} messages, all due at {at} ({load()})")
                produce_s = produce_burst(settings, target, args.messages, at, args.value_bytes)
                margin = at - time.time()
                stderr(f"produced in {produce_s:.1f} s; due in {margin:.1f} s")
                time.sleep(max(0.0, at - args.lookahead - 1 - time.time()))
                before_load_rss = vm_rss(daemon.pid) or 0
                cpu_before = cpu_seconds(daemon.pid)
                stderr(f"slot loads begin, due in {at - time.time():.1f} s: {load()}")
                deadline = time.monotonic() + max(0.0, at - time.time()) + 900
                wait = wait_for_ids if args.guarantee == "exactly-once" else wait_for_count
                arrived = wait(bootstrap, target, args.messages, deadline)
                cpu = cpu_seconds(daemon.pid) - cpu_before
                stderr(f"{arrived:,} arrived; {load()}")
            peak_rss = rss.peak
        peak_held = max((v[BUFFERED] for _, v in held.samples), default=0.0)
        load_began = held.first(BUFFERED, 1)
        all_loaded = held.first(BUFFERED, 0.99 * args.messages)
        stderr("reading both sides back")
        sources = read_topic(bootstrap, settings.precise_topic)
        arrivals = read_topic(bootstrap, target)

    dues = {s.message_id: due_ms(s) for s in sources if s.message_id}
    joined = join(dues, arrivals)
    late = joined.lateness
    due = at * 1000
    first, last = (min(joined.arrivals), max(joined.arrivals)) if late else (due, due)
    within_1s = sum(1 for x in late if x <= 1000)
    within_100ms = sum(1 for x in late if x <= 100)
    drain = (len(late) - 1) / max(0.001, (last - first) / 1000)
    n = args.messages
    print(
        f"\nburst of {n:,} exact messages of {args.value_bytes} B, all due at one instant "
        f"({args.ahead:g} s ahead), precise topic of {args.partitions} partitions, "
        f"lookahead {args.lookahead:g} s, {args.guarantee}; daemon in its own process"
    )
    print(
        f"produce time              : {produce_s:.1f} s ({n / produce_s:,.0f} msg/s), "
        f"finished {margin:.1f} s before due"
    )
    print(
        f"arrived                   : {len(late):,} (lost {joined.lost:,}, "
        f"duplicates {joined.duplicates:,}, early {joined.early:,})"
    )
    print(
        f"lateness p50 / p99 / max  : {pct(late, 0.5):,.0f} / {pct(late, 0.99):,.0f} / "
        f"{max(late, default=0):,.0f} ms"
    )
    print(f"due -> first arrival      : {(first - due) / 1000:.2f} s")
    print(f"due -> last arrival       : {(last - due) / 1000:.2f} s")
    print(
        f"forwarded within 1 s      : {within_1s:,} ({100 * within_1s / n:.1f}%); "
        f"within 100 ms: {within_100ms:,}"
    )
    print(f"drain rate, first to last : {drain:,.0f} msg/s")
    print(
        f"daemon CPU, loads to end  : {cpu:.1f} s ({cpu * 1e6 / n:.1f} us per message; "
        "the forwarder and the loader share one GIL)"
    )
    print(
        f"slot loads (/metrics)     : first record in memory {rel(load_began, at)}, "
        f"99% of the burst {rel(all_loaded, at)}; peak held {peak_held:,.0f}"
    )
    cap = settings.max_buffered_bytes
    print(
        f"memory cap                : max_buffered_bytes {cap / MiB:.0f} MiB; peak RSS "
        f"{peak_rss / MiB:.0f} MiB is cap + {(peak_rss - cap) / MiB:.0f} MiB"
    )
    print(
        f"daemon RSS                : idle {idle_rss / MiB:.0f} MiB, "
        f"before the slot loads {before_load_rss / MiB:.0f} MiB, "
        f"peak {peak_rss / MiB:.0f} MiB ({(peak_rss - idle_rss) / n:,.0f} B per message "
        f"above idle)"
    )
    print(
        f"RocketMQ 5 (apache/rocketmq#6566): about {ROCKETMQ_ON_TIME:,} of 500,000 on time, "
        f"the rest >= {ROCKETMQ_LATE_S} s late; here {within_1s:,} within 1 s "
        f"({within_1s / ROCKETMQ_ON_TIME:.1f}x), last {(last - due) / 1000:.1f} s after due"
    )
    problems = report_log(log_path)
    print(
        f"\nsummary: burst {n:,} due at one instant: lateness p50/p99/max "
        f"{pct(late, 0.5) / 1000:.2f} / {pct(late, 0.99) / 1000:.2f} / "
        f"{max(late, default=0) / 1000:.2f} s, {within_1s:,} within 1 s, last arrival "
        f"{(last - due) / 1000:.1f} s after due, {drain:,.0f} msg/s, "
        f"{cpu * 1e6 / n:.1f} us CPU per message, peak RSS "
        f"{peak_rss / MiB:.0f} MiB; early {joined.early}, lost {joined.lost}; "
        f"{problems} daemon log warnings"
    )
    stderr(f"end: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
