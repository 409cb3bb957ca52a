"""Steady load: how late the daemon forwards at a constant rate over three levels.

A load generator in its own process sends `--rate` delayed messages per second for
`--seconds` through `DelayProducer`, spread evenly over the levels. The daemon runs as
`python -m delayservice run` in another process. Afterwards this process reads every
level topic and the target (all LogAppendTime) and joins them by `delay-id`, so the
figures come from the broker's clocks, not from the daemon's own view:

    due      = append time on the level topic + max(level delay, delay-ms)
    lateness = append time on the target - due      (negative = early)

A reader in this process also tails the target while the load runs, with the
isolation level of a consumer that trusts the guarantee (read_committed for
exactly-once, read_uncommitted otherwise), and takes the time each record reaches it:
what a consumer of the target experiences. Exactly-once records become visible when
their transaction commits, so that figure includes the commit interval.

    python benchmarks/steady_lateness.py [--rate 10000] [--seconds 60]
    python benchmarks/steady_lateness.py --guarantee exactly-once
    python benchmarks/steady_lateness.py --burst 300000 --levels 5s   # a burst into one level
    python benchmarks/steady_lateness.py --hogs 1      # beside a process that spins a core
    python benchmarks/steady_lateness.py --levels 1s,2h --backlog 300000 --rate 2000
        # a backlog parked in the top level (not due) while the load runs on the others

With `--backlog N`, N messages for the top level are written before the daemon starts
and wait there (due an hour or more later): the daemon reads them and pauses their
partitions near the mark, and the steady load runs on the other levels. Run it with
`--park-top` instead on the same levels to compare (the same flow, nothing parked): one
level's backlog must not slow another's forwarding.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from delayservice.envelope import H_DELAY_MS, H_ID
from delayservice.kafka import topics
from delayservice.kafka.ready_batch import ready_batch
from delayservice.kafka.record_headers import header_values
from delayservice.metrics.service_metrics import COMMIT_STEPS
from delayservice.ports import free_port
from delayservice.producer import DelayProducer
from delayservice.settings import Settings
from delayservice.settings_loading import load_settings, settings_env

sys.path.insert(0, str(Path(__file__).parent))
from cpu_hogs import cpu_hogs
from daemon_process import running_daemon, scrape, series_sum
from forwarding import (
    LOG_APPEND,
    add_layout_option,
    add_producer_option,
    broker,
    producer_settings,
    topic_ends,
)

TARGET_PARTITIONS = 6


def generate(
    settings: Settings,
    target: str,
    rate: int,
    seconds: float,
    burst: int = 0,
    skip_top: bool = False,
) -> int:
    """Send `rate` messages per second for `seconds`, in 10 ms steps, over every level
    (but the top one when `skip_top`), or (`burst`) that many as fast as the producer
    takes them; returns the count."""
    if burst:
        return _burst(settings, target, burst)
    levels = [level.delay_ms / 1000 for level in settings.level_set()]
    if skip_top:
        levels = levels[:-1]
    producer = DelayProducer(
        {"bootstrap.servers": settings.bootstrap_servers, "linger.ms": 5}, settings=settings
    )
    value = b"v" * 200
    sent = 0
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        for _ in range(int(elapsed * rate) - sent):
            while True:
                try:
                    producer.produce(
                        target, value, str(sent).encode(), delay=levels[sent % len(levels)]
                    )
                    break
                except BufferError:
                    producer.poll(0.01)
            sent += 1
        producer.poll(0)
        time.sleep(max(0.0, 0.01 - (time.monotonic() - start - elapsed)))
    producer.flush(60)
    return sent


def _burst(settings: Settings, target: str, count: int, top: bool = False) -> int:
    level = settings.level_set().levels[-1 if top else 0]
    delay = level.delay_ms / 1000
    producer = DelayProducer(
        {"bootstrap.servers": settings.bootstrap_servers, "linger.ms": 5}, settings=settings
    )
    value = b"v" * 200
    for sent in range(count):
        while True:
            try:
                producer.produce(target, value, str(sent).encode(), delay=delay)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(120)
    return count


def read_all(bootstrap: str, topic: str) -> list[tuple[bytes | None, int, bytes | None]]:
    """(delay-id, append time, delay-ms) of every record of `topic`, read by assignment."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"steady-read-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    meta = consumer.list_topics(topic, timeout=10).topics[topic]
    ends = {}
    for p in meta.partitions:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        if high > 0:
            ends[p] = high
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    out = []
    while ends:
        batch = consumer.consume(10_000, 1.0)
        if not batch:
            break  # everything up to the snapshot was read (a last commit marker remains)
        for message in batch:
            if message.error() is not None:
                continue
            ts_type, ts = message.timestamp()
            if ts_type != TIMESTAMP_LOG_APPEND_TIME:
                raise RuntimeError(f"{topic} must use LogAppendTime")
            headers = header_values(message)
            out.append((headers.get(H_ID), ts, headers.get(H_DELAY_MS)))
        # By position, not by the last record's offset: a transactional topic ends in
        # a commit marker, which takes an offset but is never returned.
        positions = consumer.position([TopicPartition(topic, p) for p in ends])
        for tp in positions:
            if tp.offset >= ends[tp.partition]:
                del ends[tp.partition]
    consumer.close()
    return out


class LiveReader:
    """Tails `topic` from its start in a thread; the local time each id first arrives."""

    def __init__(self, bootstrap: str, topic: str, isolation: str) -> None:
        self.seen: dict[bytes, int] = {}
        self._stop = threading.Event()
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"steady-live-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": isolation,
                "fetch.wait.max.ms": 5,
            }
        )
        self._consumer.subscribe([topic])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            # What is queued, or the first record to arrive: consume(n, timeout) waits
            # out its timeout until n arrive, which would add up to that to each time.
            batch = ready_batch(self._consumer, 10_000, 0.05)
            now_ms = int(time.time() * 1000)
            for message in batch:
                if message.error() is None:
                    mid = header_values(message).get(H_ID)
                    if isinstance(mid, bytes):
                        self.seen.setdefault(mid, now_ms)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def target_count(consumer: Consumer, topic: str) -> int:
    """Offsets `topic` holds (its records, and under exactly-once commit markers)."""
    return sum(topic_ends(consumer, topic).values())


def commit_steps(port: int) -> str:
    """The daemon's own account of its commit points (`delayservice_commit_step_seconds`,
    every level together): how long a level stopped sending at each, step by step."""
    try:
        metrics = scrape(port)
    except OSError as exc:  # the daemon is gone: the figures from the broker still stand
        return f"commit points could not be read ({exc})"
    parts = []
    for step in COMMIT_STEPS:
        count = series_sum(metrics, "delayservice_commit_step_seconds_count", step=step)
        total = series_sum(metrics, "delayservice_commit_step_seconds_sum", step=step)
        if count > 0:
            parts.append(f"{step} {1000 * total / count:.1f} ms")
    points = series_sum(metrics, "delayservice_commit_step_seconds_count", step="flush")
    return f"{points:.0f} commit points, mean per step: " + ", ".join(parts)


def percentile(values: Sequence[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=10_000, help="messages per second")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--levels", default="1s,2s,5s")
    parser.add_argument(
        "--guarantee", choices=["at-least-once", "exactly-once"], default="at-least-once"
    )
    parser.add_argument("--burst", type=int, default=0, help="send this many at once instead")
    parser.add_argument(
        "--backlog", type=int, default=0, help="park this many in the top level first"
    )
    parser.add_argument(
        "--park-top",
        action="store_true",
        help="the flow uses the levels below the top one (implied by --backlog), for a "
        "quiet run to compare a backlog's with",
    )
    parser.add_argument(
        "--hogs", type=int, default=0, help="busy processes running beside the load"
    )
    parser.add_argument("--bootstrap", help="an existing broker instead of a local one")
    add_producer_option(parser)
    add_layout_option(parser)
    parser.add_argument("--generate", help=argparse.SUPPRESS)  # the load generator's role
    parser.add_argument("--skip-top", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.generate:  # child: bootstrap and topic prefix come in through the environment
        child = load_settings()
        if args.backlog:
            print(_burst(child, args.generate, args.backlog, top=True))
            return 0
        sent = generate(
            child, args.generate, args.rate, args.seconds, args.burst, skip_top=args.skip_top
        )
        print(sent)
        return 0

    park_top = bool(args.backlog or args.park_top)
    with broker(args.bootstrap) as bootstrap:
        tag = uuid.uuid4().hex[:6]
        settings = load_settings(
            bootstrap_servers=bootstrap,
            levels=args.levels,
            topic_prefix=f"steady-{tag}-",
            group_id=f"steady-{tag}",
            dead_letter_topic=f"steady-{tag}-dlq",
            guarantee=args.guarantee,
            producer=producer_settings(args),
            level_workers=args.level_workers,
        )
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topics.create(admin, settings)
        target = f"steady-{tag}-target"
        new = NewTopic(target, TARGET_PARTITIONS, 1, config=LOG_APPEND)
        admin.create_topics([new])[target].result(30)

        isolation = "read_committed" if args.guarantee == "exactly-once" else "read_uncommitted"
        live = LiveReader(bootstrap, target, isolation)
        port = free_port()
        ends = Consumer({"bootstrap.servers": bootstrap, "group.id": f"steady-ends-{tag}"})
        parked = 0
        if args.backlog:
            parked = int(
                subprocess.run(
                    [sys.executable, __file__, "--generate", target, "--backlog",
                     str(args.backlog)],
                    env=settings_env(settings), capture_output=True, text=True, check=True,
                ).stdout.split()[-1]
            )  # fmt: skip
        with (
            running_daemon(settings, f"steady-{tag}", ready_within=120, port=port),
            cpu_hogs(args.hogs),
        ):
            generator = subprocess.run(
                [sys.executable, __file__, "--generate", target, "--rate", str(args.rate),
                 "--seconds", str(args.seconds), "--burst", str(args.burst),
                 *(["--skip-top"] if park_top else [])],
                env=settings_env(settings), capture_output=True, text=True, check=True,
            )  # fmt: skip
            sent = int(generator.stdout.split()[-1])
            flow = list(settings.level_set())[: -1 if park_top else None]
            top = max(level.delay_ms for level in flow) / 1000
            deadline = time.monotonic() + top + 120
            while target_count(ends, target) < sent and time.monotonic() < deadline:
                time.sleep(0.5)
            while len(live.seen) < sent and time.monotonic() < deadline:
                time.sleep(0.5)
            steps = commit_steps(port)
        live.stop()
        ends.close()

        delay_of = {level.topic: level.delay_ms for level in settings.level_set()}
        due: dict[bytes, int] = {}
        for topic, level_ms in delay_of.items():
            for message_id, ts, delay_ms in read_all(bootstrap, topic):
                if message_id is not None:
                    due[message_id] = ts + max(level_ms, int(delay_ms or 0))
        arrivals = read_all(bootstrap, target)

    lateness = [ts - due[mid] for mid, ts, _ in arrivals if mid is not None and mid in due]
    forwarded = {mid for mid, _, _ in arrivals}
    early = sum(1 for late in lateness if late < 0)
    now_ms = time.time() * 1000
    missing = sum(1 for mid, at in due.items() if mid not in forwarded and at <= now_ms)
    duplicates = len(arrivals) - len(forwarded)
    seen = [at - due[mid] for mid, at in live.seen.items() if mid in due]
    interval_ms = settings.commit_interval() * 1000
    load = (
        f"a burst of {sent:,} messages"
        if args.burst
        else f"{sent:,} messages at {args.rate:,} msg/s for {args.seconds:.0f} s"
    )
    if parked:
        load += f", beside {parked:,} parked in the top level (not due)"
    print(
        f"{load} over levels "
        f"{args.levels} ({args.level_workers} level workers), guarantee={args.guarantee} "
        f"(commit interval {interval_ms:.0f} ms); "
        f"generator and daemon in their own processes, {args.hogs} CPU hog(s) beside them"
    )
    print(
        f"lateness by target append time: p50 {percentile(lateness, 0.5):.0f} ms, "
        f"p99 {percentile(lateness, 0.99):.0f} ms, max {max(lateness):.0f} ms   "
        + ("(target: p99 <= 500 ms)" if args.burst else "(targets: p50 <= 5 ms, p99 <= 25 ms)")
    )
    goal = f"p99 <= {interval_ms + 25:.0f} ms" if args.guarantee == "exactly-once" else ""
    print(
        f"lateness as a {isolation} reader sees it: p50 {percentile(seen, 0.5):.0f} ms, "
        f"p99 {percentile(seen, 0.99):.0f} ms, max {max(seen):.0f} ms   {goal}"
    )
    print(f"early {early}, missing {missing}, duplicates {duplicates}")
    print(f"the daemon's {steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
