"""Cancels at scale: how a flood of level markers, and a share of real cancels, changes
what an application's delayed messages meet.

A flooding process writes `--flood` well-formed cancel markers as fast as it can, with
ids that name real level partitions and a current send time but no message (a batch job
cancelling reminders that already went, or a client that misbehaves): they land on the
markers partitions the SDK would choose for such ids. While it runs, an application in
another process sends `--messages` level messages over `--levels` through
`DelayProducer` and cancels `--cancel-share` of them through `DelayProducer.cancel`, at
least two seconds before their due times. The daemon runs as `python -m delayservice
run` in its own process. Afterwards the level topics and the target are read back and
joined by id (broker append times):

    lateness = append time on the target - (append time on the level topic + level delay)

and the daemon's resident memory is read from /proc before the flood and at the end.
Nothing is measured before one warm-up message has gone through the daemon.

    python benchmarks/marker_flood.py                       # 1,000,000 markers
    python benchmarks/marker_flood.py --flood 0             # the same messages, no flood
    python benchmarks/marker_flood.py --flood 100000 --cancel-share 0.01
    python benchmarks/marker_flood.py --flood-partition 0   # every flood id on partition 0

With `--flood-partition`, the lateness is given apart for the messages on that level
partition (whose markers share the flooded markers partition) and for the others.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from delayservice.kafka import topics
from delayservice.markers.level_ids import level_place
from delayservice.ports import free_port
from delayservice.producer import DelayProducer
from delayservice.settings import Settings
from delayservice.settings_loading import load_settings, settings_env

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parents[1]))
from daemon_process import running_daemon
from forwarding import LOG_APPEND, broker, topic_ends
from steady_lateness import percentile, read_all

from tests.faults.flood import Flood

TARGET_PARTITIONS = 3


def flood(settings: Settings, count: int, only: int | None) -> float:
    """Write `count` cancel markers for ids of no message (of level partition `only`, or
    of every one in turn); returns the seconds it took."""
    return Flood(settings, count, only).run()


def application(settings: Settings, target: str, count: int, share: float) -> str:
    """Send `count` level messages, spread over the levels, and cancel `share` of them
    at once; returns 'sent cancelled' ids as text for the parent."""
    producer = DelayProducer(
        {"bootstrap.servers": settings.bootstrap_servers, "linger.ms": 5}, settings=settings
    )
    levels = [level.delay_ms / 1000 for level in settings.level_set()]
    every = round(1 / share) if share > 0 else 0
    cancelled: list[str] = []
    receipts = []
    for n in range(count):
        message_id = producer.produce(target, b"v" * 100, str(n).encode(), delay=levels[n % 3])
        if every and n % every == 0:
            receipts.append(producer.cancel(message_id))
            cancelled.append(message_id)
        producer.poll(0)
        time.sleep(0.001)
    producer.flush(60)
    return " ".join(cancelled)


def warm_up(settings: Settings, target: str, timeout_s: float = 120.0) -> str:
    """One message through the daemon before anything is measured, waited for on the
    target. On a broker just started the daemon's producer may wait for its producer id
    (the coordinator still loading: 'Coordinator load in progress' was logged in a run),
    and every message of that time would wait with it, whatever the markers do.
    Returns its id."""
    producer = DelayProducer({"bootstrap.servers": settings.bootstrap_servers}, settings=settings)
    shortest = min(level.delay_ms for level in settings.level_set()) / 1000
    message_id = producer.produce(target, b"warm-up", delay=shortest)
    if producer.flush(30) != 0:
        raise SystemExit("the warm-up message was not acknowledged in 30 s")
    ends = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": "warm-up"})
    try:
        deadline = time.monotonic() + timeout_s
        while sum(topic_ends(ends, target).values()) < 1:
            if time.monotonic() > deadline:
                raise SystemExit(f"the warm-up message did not arrive in {timeout_s:.0f} s")
            time.sleep(0.2)
    finally:
        ends.close()
    return message_id


def _level_partition(message_id: str) -> int | None:
    place = level_place(message_id)
    return None if place is None else place.partition


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flood", type=int, default=1_000_000, help="markers of no message")
    parser.add_argument(
        "--flood-partition", type=int, help="every flood id names this level partition"
    )
    parser.add_argument("--messages", type=int, default=3_000)
    parser.add_argument("--cancel-share", type=float, default=1 / 30)
    parser.add_argument("--levels", default="2s,3s,5s")
    parser.add_argument(
        "--guarantee", choices=["at-least-once", "exactly-once"], default="at-least-once"
    )
    parser.add_argument("--bootstrap", help="an existing broker instead of a local one")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.role == "flood":
        print(f"{flood(load_settings(), args.flood, args.flood_partition):.1f}")
        return 0
    if args.role == "app":
        print(application(load_settings(), args.target, args.messages, args.cancel_share))
        return 0

    with broker(args.bootstrap) as bootstrap:
        tag = uuid.uuid4().hex[:6]
        settings = load_settings(
            bootstrap_servers=bootstrap,
            levels=args.levels,
            topic_prefix=f"flood-{tag}-",
            group_id=f"flood-{tag}",
            dead_letter_topic=f"flood-{tag}-dlq",
            markers_topic=f"flood-{tag}-markers",
            guarantee=args.guarantee,
        )
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topics.create(admin, settings)
        target = f"flood-{tag}-target"
        new = NewTopic(target, TARGET_PARTITIONS, 1, config=LOG_APPEND)
        admin.create_topics([new])[target].result(30)
        ends = Consumer({"bootstrap.servers": bootstrap, "group.id": f"flood-ends-{tag}"})
        env = settings_env(settings)
        me = [sys.executable, __file__, "--flood", str(args.flood), "--messages",
              str(args.messages), "--cancel-share", str(args.cancel_share)]  # fmt: skip
        if args.flood_partition is not None:
            me += ["--flood-partition", str(args.flood_partition)]
        with running_daemon(settings, f"flood-{tag}", ready_within=120, port=free_port()) as d:
            warm = warm_up(settings, target)
            rss_before = rss_mib(d.pid)
            flooding = subprocess.Popen(
                [*me, "--role", "flood"], env=env, stdout=subprocess.PIPE, text=True
            )
            app = subprocess.run(
                [*me, "--role", "app", "--target", target],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            cancelled = set(app.stdout.split())
            flood_s = float((flooding.communicate(timeout=600)[0] or "nan").split()[-1])
            expected = args.messages - len(cancelled)
            top = max(level.delay_ms for level in settings.level_set()) / 1000
            deadline = time.monotonic() + top + 300
            while sum(topic_ends(ends, target).values()) < expected + 1:  # the warm-up too
                if time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            waited = time.monotonic() - deadline + top + 300
            time.sleep(top)  # what a leaked cancel would let through arrives by then
            rss_after = rss_mib(d.pid)
        ends.close()
        due: dict[str, int] = {}
        for level in settings.level_set():
            for message_id, ts, _ in read_all(bootstrap, level.topic):
                if message_id is not None:
                    due[message_id.decode()] = ts + level.delay_ms
        due.pop(warm, None)
        arrivals = [
            (m.decode(), ts)
            for m, ts, _ in read_all(bootstrap, target)
            if m is not None and m.decode() != warm
        ]

    delivered = {m for m, _ in arrivals}
    kept = [ts - due[m] for m, ts in arrivals if m in due and m not in cancelled]
    leaked = len(delivered & cancelled)
    missing = len(set(due) - cancelled - delivered)
    early = sum(1 for late in kept if late < 0)
    print(
        f"{args.flood:,} flood markers written in {flood_s:.1f} s beside {args.messages:,} "
        f"level messages over {args.levels}, {len(cancelled)} of them cancelled, "
        f"guarantee={args.guarantee}; waited {waited:.0f} s for the target"
    )
    if kept:
        print(
            f"lateness of the messages kept: p50 {percentile(kept, 0.5):.0f} ms, "
            f"p99 {percentile(kept, 0.99):.0f} ms, max {max(kept):.0f} ms"
        )
    if args.flood_partition is not None:
        for name, on_it in (("on the flooded partition", True), ("on the others", False)):
            part = [
                ts - due[m]
                for m, ts in arrivals
                if m in due
                and m not in cancelled
                and (_level_partition(m) == args.flood_partition) is on_it
            ]
            if part:
                print(
                    f"  {name} ({len(part):,}): p50 {percentile(part, 0.5):.0f} ms, "
                    f"p99 {percentile(part, 0.99):.0f} ms, max {max(part):.0f} ms"
                )
    print(f"delivered {len(delivered & set(due)):,}, missing {missing}, early {early}, "
          f"cancels leaked {leaked} of {len(cancelled)}")  # fmt: skip
    grown = rss_after - rss_before
    per = grown * 2**20 / args.flood if args.flood else float("nan")
    print(
        f"daemon RSS {rss_before:.0f} MiB before the flood, {rss_after:.0f} MiB after "
        f"(+{grown:.0f} MiB, {per:.0f} B per flood marker)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
