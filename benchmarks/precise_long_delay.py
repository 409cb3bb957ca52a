"""Precise mode, delays up to a year: memory, restart and intake with far-future messages.

One run, the daemon as `python -m delayservice run` in its own process, measured from
outside (RSS from /proc, readiness from /readyz, progress from the committed offsets of
its group on the topic the messages go to: `{group_id}-precise-far-0` on the far topic
with the default `--far-after`, `{group_id}-precise-0` on the precise topic when
`--far-after` is longer than every delay here):

1. started on the empty precise topic: RSS idle; then stopped;
2. `--messages` exact messages (default 1,000,000) of `--value-bytes`, due uniformly
   between now + 2 h and now + `--to-days` (default 365), are produced by
   `--producers` processes with the daemon down;
3. the daemon is started again: the intake rate is the backlog over the time from its
   start until its committed offsets reach the topic's end, watched from the moment the
   process is spawned (it reports ready only once caught up); RSS growth is RSS then
   (after `--settle` s) minus RSS idle, and the peak is sampled from the spawn on;
4. it is killed with SIGKILL and started again on the same data directory: the time
   until /readyz answers, and until the intake has caught up again;
5. with that daemon running, `--far` (default 1,000,000) more far-future messages are
   produced from this process as fast as one producer goes, and right behind them
   `--near` (default 300) messages due in 2 to 12 s. Their lateness is the target's
   append time minus their due time (precise-topic append time + delay), joined by
   `delay-id`.

    python benchmarks/precise_long_delay.py [--messages 1000000] [--producers 2]
    python benchmarks/precise_long_delay.py --far-after 366d   # one topic for every delay
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from daemon_process import metrics_port, scrape, series_sum
from forwarding import broker
from precise_burst import fast_producer
from precise_common import (
    CommittedReader,
    MiB,
    RssSampler,
    bare_consume_rate,
    create_topics,
    data_dir,
    due_ms,
    end_offsets,
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
)
from precise_memory import on_disk, produce_all, settle_rss

from delayservice.precise.precise_worker import precise_group_id
from delayservice.settings import Settings

DAY = 86_400.0
GOALS = {
    "rss": "<= 100 MiB",
    "restart": "<= 30 s",
    "intake": ">= 75,000 msg/s",
    "near_p99": "<= 100 ms",
}


def held_on(settings: Settings) -> tuple[str, str]:
    """The topic this benchmark's far-future messages go to (due 2 h and more out), and
    the group its intake commits under."""
    far = settings.precise_far_after_ms < 2 * 3600 * 1000
    topic = settings.precise_far_topic if far else settings.precise_topic
    return topic, precise_group_id(settings, 0, far=far)


def caught_up(
    settings: Settings, ends: dict[int, int], deadline: float, marks: dict[int, float] | None = None
) -> float | None:
    """Seconds until the daemon's committed offsets reach `ends`, None past `deadline`;
    `marks` gets the monotonic time each tenth of the way was first seen."""
    started = time.monotonic()
    topic, group = held_on(settings)
    total = max(1, sum(ends.values()))
    reader = CommittedReader(settings.bootstrap_servers, group, topic)
    try:
        while time.monotonic() < deadline:
            done = reader(ends)
            seen = time.monotonic()
            if marks is not None:
                share = sum(min(done.get(p, 0), end) for p, end in ends.items()) * 10 // total
                for tenth in range(1, share + 1):
                    marks.setdefault(tenth, seen)
            if all(done.get(p, 0) >= end for p, end in ends.items()):
                return seen - started
            time.sleep(0.25)
    finally:
        reader.close()
    return None


def far_then_near(
    settings: Settings, target: str, args: argparse.Namespace
) -> tuple[float, dict[bytes, float]]:
    """`args.far` far-future messages, then right behind them `args.near` due in 2 to
    12 s; returns the seconds the far ones took to produce, and the near ones' delays."""
    producer = fast_producer(settings)
    rng = random.Random(args.seed + 100)
    value = b"f" * args.value_bytes
    now = time.time()
    started = time.monotonic()
    for i in range(args.far):
        while True:
            try:
                producer.produce(target, value, deliver_at=now + rng.uniform(2 * 3600, 365 * DAY))
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    far_s = time.monotonic() - started
    near: dict[bytes, float] = {}
    for _ in range(args.near):
        delay = rng.uniform(2.0, 12.0)
        near[producer.produce(target, b"near", delay=delay).encode()] = delay
    if producer.flush(120) != 0:
        raise SystemExit("the producer could not deliver every message")
    return far_s, near


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--messages", type=int, default=1_000_000, help="pending messages")
    parser.add_argument("--to-days", type=float, default=365.0, help="latest due, from now")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--producers", type=int, default=2, help="producer processes")
    parser.add_argument("--partitions", type=int, default=3, help="of the precise topic")
    parser.add_argument("--far", type=int, default=1_000_000, help="far ones before the near")
    parser.add_argument(
        "--far-after",
        default=None,
        help="precise_far_after for producer and daemon (default: the setting's, 1h)",
    )
    parser.add_argument("--near", type=int, default=300, help="due in 2 to 12 s")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds of RSS sampling")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--consumer",
        type=json.loads,
        default={},
        help="extra client settings for the daemon's consumers, as JSON (default: none)",
    )
    parser.add_argument("--bootstrap", help="an existing broker instead of a local one")
    args = parser.parse_args()
    args.from_s, args.to_s = 2 * 3600.0, args.to_days * DAY  # for produce_all

    log_path = Path(f"/tmp/precise-long-delay-{int(time.time())}.log")
    stderr(f"start: {load()}; daemon log in {log_path}")
    n = args.messages
    with broker(args.bootstrap) as bootstrap, data_dir("long-delay") as root:
        tag = tag_for("long")
        far_after = {"precise_far_after": args.far_after} if args.far_after else {}
        settings = precise_settings(
            bootstrap, tag, root, partitions=args.partitions, consumer=args.consumer, **far_after
        )
        topic, target = settings.precise_topic, f"{tag}-target"
        held_topic, _ = held_on(settings)
        create_topics(settings, [target], 3)

        with logged_daemon(settings, tag, log_path) as daemon:
            idle = settle_rss(daemon.pid, args.settle)
        stderr(f"idle daemon: {idle / MiB:.0f} MiB RSS; producing {n:,} messages")
        produce_s = produce_all(settings, target, args)
        ends = end_offsets(bootstrap, held_topic)
        bare = bare_consume_rate(bootstrap, held_topic, ends)
        stderr(
            f"produced {n:,} in {produce_s:.0f} s; a bare consume() reads them at "
            f"{bare:,.0f} msg/s; starting the daemon for the intake"
        )

        # The daemon reports ready only once its intake has caught up, so the intake is
        # watched from the moment the process is spawned: progress and RSS.
        marks: dict[int, float] = {}
        finished: list[float | None] = []
        started = time.monotonic()
        watch = threading.Thread(
            target=lambda: finished.append(caught_up(settings, ends, started + 3600, marks)),
            daemon=True,
        )
        samplers: list[RssSampler] = []
        with contextlib.ExitStack() as stack:

            def on_start(process: Any) -> None:
                samplers.append(stack.enter_context(RssSampler(process.pid)))

            watch.start()
            daemon = stack.enter_context(
                logged_daemon(settings, tag, log_path, ready_within=3600, on_start=on_start)
            )
            ready_intake_s = time.monotonic() - started
            watch.join(3600)
            intake_s = finished[0] if finished else None
            if intake_s is None:
                raise SystemExit("the intake did not finish within an hour")
            after = settle_rss(daemon.pid, args.settle)
            peak = samplers[0].peak
            metrics = scrape(metrics_port(daemon.pid))
            files, size = on_disk(root)
            tenths = ", ".join(
                f"{k * 10}% at {v - started:.1f} s" for k, v in sorted(marks.items())
            )
            stderr(
                f"intake {n / intake_s:,.0f} msg/s ({tenths}); RSS {after / MiB:.0f} MiB; kill -9"
            )
            daemon.kill()
            daemon.wait(30)

        started = time.monotonic()
        with logged_daemon(settings, tag, log_path, ready_within=300) as daemon:
            ready_s = time.monotonic() - started
            again_s = caught_up(settings, ends, started + 600)
            restarted = settle_rss(daemon.pid, args.settle)
            stderr(f"ready {ready_s:.1f} s after the restart; far then near ({load()})")
            starts = end_offsets(bootstrap, topic)
            far_s, near = far_then_near(settings, target, args)
            deadline = time.monotonic() + 120
            arrived = wait_for_count(bootstrap, target, len(near), deadline)
            stderr(f"{arrived} of {len(near)} near messages arrived")
            behind_rss = vm_rss(daemon.pid) or 0
        sources = read_topic(bootstrap, topic, starts)
        arrivals = read_topic(bootstrap, target)

    span = marks[9] - marks[1] if 1 in marks and 9 in marks else 0.0
    # Offsets are polled every quarter second or so: a shorter span measures the polls.
    steady = f"{0.8 * n / span:,.0f} msg/s" if span >= 1.0 else "too quick to measure"
    dues = {s.message_id: due_ms(s) for s in sources if s.message_id in near}
    joined = join(dues, arrivals)
    late = joined.lateness
    growth = after - idle
    consumer = f"; consumer {json.dumps(args.consumer)}" if args.consumer else ""
    on_disk_metric = series_sum(metrics, "delayservice_precise_slot_files", state="on_disk")
    print(
        f"\n{n:,} pending exact messages of {args.value_bytes} B, due uniformly over now + "
        f"2 h .. now + {args.to_days:g} days, on {held_topic} of {args.partitions} partitions "
        f"(default settings: max_delay {settings.max_delay}, horizon "
        f"{settings.precise_horizon_s} s{consumer}); daemon in its own process"
    )
    print(f"produce time           : {produce_s:.0f} s ({n / produce_s:,.0f} msg/s)")
    print(
        f"intake                 : {intake_s:.1f} s from the daemon's start, "
        f"{n / intake_s:,.0f} msg/s ({n / intake_s / bare:.2f} of a bare consume() at "
        f"{bare:,.0f} msg/s, same backlog); {steady} from 10% to 90% of the backlog; ready "
        f"(/readyz) {ready_intake_s:.1f} s after the start "
        f"(goal {GOALS['intake']})"
    )
    print(
        f"RSS                    : idle {idle / MiB:.0f} MiB, after the intake "
        f"{after / MiB:.0f} MiB (peak {peak / MiB:.0f}); growth {growth / MiB:.0f} MiB "
        f"(goal {GOALS['rss']})"
    )
    print(
        f"on disk                : {files:,} files, {size / MiB:,.0f} MiB; "
        f"/metrics files on disk {on_disk_metric:,.0f}"
    )
    caught = f"{again_s:.1f} s" if again_s is not None else "not within 600 s"
    print(
        f"restart after kill -9  : ready (/readyz) {ready_s:.1f} s (goal {GOALS['restart']}); "
        f"intake caught up {caught} later; RSS {restarted / MiB:.0f} MiB"
    )
    print(
        f"near behind far        : {args.far:,} far-future produced in {far_s:.1f} s "
        f"({args.far / max(far_s, 0.001):,.0f} msg/s) to {held_topic}, then "
        f"{len(near)} due in 2-12 s: {len(late)} arrived (lost {joined.lost}, early "
        f"{joined.early}, duplicates {joined.duplicates}); lateness p50 / p99 / max "
        f"{pct(late, 0.5):,.0f} / {pct(late, 0.99):,.0f} / {max(late, default=0):,} ms "
        f"(goal p99 {GOALS['near_p99']}); RSS then {behind_rss / MiB:.0f} MiB"
    )
    problems = report_log(log_path)
    print(
        f"\nsummary: {n:,} pending over a year: RSS growth {growth / MiB:.0f} MiB, intake "
        f"{n / intake_s:,.0f} msg/s ({steady} from 10% to 90%; bare consume() "
        f"{bare:,.0f} msg/s), ready {ready_s:.1f} s "
        "after kill -9, near behind "
        f"{args.far:,} far p99 {pct(late, 0.99):,.0f} ms; early {joined.early}, lost "
        f"{joined.lost}; {problems} daemon log warnings"
    )
    stderr(f"end: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
