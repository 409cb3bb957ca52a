"""Forwarding throughput: the daemon against the bare consume->produce pipe a user would write.

Both move the same number of already-due records (same size, same headers) on the same
broker in the same run, in alternating rounds, and both are timed the same way from
outside: from the first forwarded record's broker timestamp to the last one's, on a
destination topic with LogAppendTime, read back by a separate consumer once everything
has arrived (the pipe after it ends; the daemon once the destination's end offsets
show every record), so that reading never competes with either for the host's CPU.

- The pipe is the fastest honest Python baseline: `consume(10000, 1.0)`, then
  `produce(dst, value, key, headers=msg.headers())` per record, acks=all with
  idempotence, no compression, no per-record parsing, no delivery callbacks, one
  asynchronous commit per batch. It knows its destination in advance.
- The daemon is `python -m delayservice run` in its own process, reading a 1 s level
  whose records all fell due before it started.

Both are also timed from their start to the last arrival (catch-up): the drain of a
backlog that fell due while nothing forwarded, start-up and group join included.

The daemon runs once per guarantee in each round (at-least-once, then exactly-once,
each over a backlog of its own); an exactly-once forward counts when its transaction
commits, since the reader is read_committed, as librdkafka's consumers are by default.

    python benchmarks/forwarding.py [--messages 200000] [--rounds 3]
    python benchmarks/forwarding.py --messages 1000000 --rounds 1     # the catch-up figure
    python benchmarks/forwarding.py --levels 3 --processes 2          # two worker processes
    python benchmarks/forwarding.py --guarantees exactly-once         # one guarantee only
    python benchmarks/forwarding.py --cancel-share 0.01 --level-delay 30   # 1% cancelled

With `--cancel-share`, that share of the daemon's records is cancelled (markers on the
markers topic, appended before the records are due), so every partition has cancels
pending while it is forwarded: the records they name are withdrawn, the others are
screened for them. Compare with the same `--level-delay` and no cancels.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import uuid
from collections.abc import Iterator

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from daemon_process import running_daemon

from delayservice.envelope import H_CANCEL, H_VERSION, Envelope, Headers, wrap
from delayservice.kafka import topics
from delayservice.markers.level_ids import level_id
from delayservice.settings_loading import load_settings
from delayservice.testing.local_broker import LocalBroker

PARTITIONS = 3
LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    with LocalBroker(heap="1g") as local:
        yield local.bootstrap


def add_producer_option(parser: argparse.ArgumentParser) -> None:
    """`--producer KEY=VALUE`, repeatable: librdkafka settings for the daemon's producers."""
    parser.add_argument(
        "--producer",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka setting for the daemon's producers (repeatable)",
    )


def add_layout_option(parser: argparse.ArgumentParser) -> None:
    """`--level-workers`: the daemon's worker layout (`level_workers`)."""
    parser.add_argument(
        "--level-workers",
        choices=["shared", "per-level"],
        default="shared",
        help="one worker for every level (the default) or one per level",
    )


def producer_settings(args: argparse.Namespace) -> dict[str, str]:
    return dict(item.split("=", 1) for item in args.producer)


def fill(
    bootstrap: str,
    topic: str,
    target: str,
    count: int,
    size: int,
    level: tuple[int, int] | None = None,
) -> list[str]:
    """`count` delayed records (envelope and one user header) for `target`; returns
    their ids. With `level` (index, delay ms), the ids are level ids naming where each
    record was written, as `DelayProducer` writes them."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 200_000,
        }
    )
    value = b"v" * size
    ids = []
    for i in range(count):
        partition = -1  # the producer's partitioner
        if level is None:
            message_id = uuid.uuid4().hex
        else:
            partition = i % PARTITIONS
            message_id = level_id(level[0], partition)
        ids.append(message_id)
        delay_ms = 1000 if level is None else level[1]
        headers = wrap(Envelope(target, delay_ms, message_id), [("trace", b"abc")])
        while True:
            try:
                key = str(i % 10_000).encode()
                producer.produce(topic, value, key, partition, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(300)
    return ids


def cancel_some(bootstrap: str, markers_topic: str, ids: list[str], share: float) -> int:
    """Cancel markers for every `1/share`-th id; returns how many."""
    if share <= 0:
        return 0
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    step = max(1, round(1 / share))
    chosen = ids[::step]
    for message_id in chosen:
        headers: Headers = [(H_VERSION, b"1"), (H_CANCEL, message_id.encode())]
        producer.produce(markers_topic, None, None, partition=0, headers=headers)
        producer.poll(0)
    producer.flush(60)
    return len(chosen)


def bare_pipe(bootstrap: str, source: str, destination: str, count: int) -> None:
    """What a user would write instead: move every record, nothing else."""
    tag = uuid.uuid4().hex[:6]
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
        }
    )
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"pipe-{tag}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([source])
    moved = 0
    while moved < count:
        batch = consumer.consume(10_000, 1.0)
        for message in batch:
            if message.error() is not None:
                continue
            while True:
                try:
                    producer.produce(
                        destination, message.value(), message.key(), headers=message.headers()
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            moved += 1
        producer.poll(0)
        if batch:
            consumer.commit(asynchronous=True)
    producer.flush(60)
    consumer.close()


def topic_ends(consumer: Consumer, topic: str) -> dict[int, int]:
    """Each partition's end offset (the next to be written)."""
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    return {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
        for p in partitions
    }


def wait_for_arrivals(bootstrap: str, topic: str, count: int, timeout: float) -> None:
    """Until `topic` holds at least `count` offsets, asking for its end offsets twice a
    second: reading the records while they arrive would take the 2 cores' CPU from
    what is measured (the pipe is read after it ends, so the daemon is too). Under
    exactly-once the commit markers take offsets too, so reading may start a few
    markers early; `arrival_rate` still waits for every record."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ends-{uuid.uuid4().hex}"})
    try:
        deadline = time.monotonic() + timeout
        while (ends := sum(topic_ends(consumer, topic).values())) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: {ends} of {count} offsets in {timeout:.0f}s")
            time.sleep(0.5)
    finally:
        consumer.close()


def arrival_rate(bootstrap: str, topic: str, count: int, timeout: float) -> tuple[float, int]:
    """Records per second between the first and the last arrival on `topic`, by the
    broker's append times, read by a consumer of its own; waits for `count` records.
    Also returns the last arrival's append time (ms)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"clock-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    first, last, seen = None, None, 0
    deadline = time.monotonic() + timeout
    try:
        while seen < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: {seen} of {count} records in {timeout:.0f}s")
            for message in consumer.consume(10_000, 0.5):
                if message.error() is not None:
                    continue
                ts_type, ts = message.timestamp()
                if ts_type != TIMESTAMP_LOG_APPEND_TIME:
                    raise RuntimeError(f"{topic} must use LogAppendTime to time arrivals")
                first = ts if first is None else min(first, ts)
                last = ts if last is None else max(last, ts)
                seen += 1
    finally:
        consumer.close()
    if first is None or last is None:
        raise RuntimeError(f"{topic}: no records")
    return (count - 1) / max(0.001, (last - first) / 1000), last


def run_round(
    bootstrap: str, args: argparse.Namespace
) -> tuple[float, float, dict[str, tuple[float, float]]]:
    """(pipe msg/s, pipe catch-up s, {guarantee: (daemon msg/s, daemon catch-up s)}).

    Catch-up is from the moment each one is started (the pipe's first line, the
    daemon's process) to the last arrival: the time a backlog that fell due while
    nothing forwarded takes to drain, start-up and group join included."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tag = uuid.uuid4().hex[:6]
    source, pipe_out = f"bench-{tag}-src", f"bench-{tag}-pipe"
    for name, config in ((source, {}), (pipe_out, LOG_APPEND)):
        admin.create_topics([NewTopic(name, PARTITIONS, 1, config=config)])[name].result(30)
    fill(bootstrap, source, pipe_out, args.messages, args.size)
    runs = []
    expected: dict[str, int] = {}
    for guarantee in args.guarantees:
        short = "eos" if guarantee == "exactly-once" else "alo"
        settings = load_settings(
            bootstrap_servers=bootstrap,
            levels=",".join(f"{n * args.level_delay}s" for n in range(1, args.levels + 1)),
            processes=args.processes,
            topic_prefix=f"bench-{tag}-{short}-",
            group_id=f"bench-{tag}-{short}",
            dead_letter_topic=f"bench-{tag}-{short}-dlq",
            partitions=PARTITIONS,
            guarantee=guarantee,
            pause_high_water=args.pause_high_water,
            pause_low_water=args.pause_high_water // 2,
            producer=producer_settings(args),
            commit_interval_s=args.commit_interval,
            level_workers=args.level_workers,
            markers_topic=f"bench-{tag}-{short}-markers",
        )
        topics.create(admin, settings)
        out = f"bench-{tag}-{short}-out"
        admin.create_topics([NewTopic(out, PARTITIONS, 1, config=LOG_APPEND)])[out].result(30)
        cancelled = 0
        for n in range(1, args.levels + 1):  # the backlog spread evenly over the levels
            share = args.messages // args.levels + (n <= args.messages % args.levels)
            level = settings.level_set().levels[n - 1]
            ids = fill(bootstrap, level.topic, out, share, args.size, (n, level.delay_ms))
            cancelled += cancel_some(bootstrap, settings.markers_topic, ids, args.cancel_share)
        expected[guarantee] = args.messages - cancelled
        runs.append((guarantee, settings, out))
    # Every record is due before a daemon starts (the last level's delay after the last).
    time.sleep(args.levels * args.level_delay)

    pipe_started = time.time()
    bare_pipe(bootstrap, source, pipe_out, args.messages)
    pipe, pipe_last = arrival_rate(bootstrap, pipe_out, args.messages, timeout=600)

    daemons: dict[str, tuple[float, float]] = {}
    for guarantee, settings, out in runs:
        started = time.time()
        with running_daemon(settings, f"bench-{tag}", quiet=True):
            wait_for_arrivals(bootstrap, out, expected[guarantee], timeout=1200)
            rate, last = arrival_rate(bootstrap, out, expected[guarantee], timeout=600)
        daemons[guarantee] = (rate, last / 1000 - started)
    return pipe, pipe_last / 1000 - pipe_started, daemons


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_layout_option(parser)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=200, help="value bytes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--guarantees",
        type=lambda text: text.split(","),
        default=["at-least-once", "exactly-once"],
        help="comma-separated: at-least-once, exactly-once",
    )
    parser.add_argument(
        "--pause-high-water", type=int, default=10_000, help="per-partition buffer bound"
    )
    parser.add_argument("--levels", type=int, default=1, help="levels the backlog spreads over")
    parser.add_argument(
        "--level-delay", type=int, default=1, help="level n is n times this many seconds"
    )
    parser.add_argument(
        "--cancel-share", type=float, default=0.0, help="share of the records cancelled"
    )
    parser.add_argument("--processes", type=int, default=1, help="the daemon's worker processes")
    parser.add_argument(
        "--commit-interval",
        type=float,
        help="seconds between the daemon's commits (default: the guarantee's own)",
    )
    parser.add_argument("--bootstrap", help="an existing broker instead of a local one")
    add_producer_option(parser)
    args = parser.parse_args()

    pipe_rates: list[float] = []
    pipe_times: list[float] = []
    rates: dict[str, list[float]] = {g: [] for g in args.guarantees}
    times: dict[str, list[float]] = {g: [] for g in args.guarantees}
    with broker(args.bootstrap) as bootstrap:
        for round_no in range(1, args.rounds + 1):
            pipe, pipe_s, daemons = run_round(bootstrap, args)
            pipe_rates.append(pipe)
            pipe_times.append(pipe_s)
            line = f"round {round_no}: bare pipe {pipe:>9,.0f} msg/s ({pipe_s:.1f} s)"
            for guarantee, (rate, seconds) in daemons.items():
                rates[guarantee].append(rate)
                times[guarantee].append(seconds)
                line += f" | {guarantee} {rate:>9,.0f} msg/s {rate / pipe:.2f} ({seconds:.1f} s)"
            print(line, flush=True)
    p, pt = statistics.median(pipe_rates), statistics.median(pipe_times)
    print(
        f"\n{args.messages:,} records of {args.size} B, {PARTITIONS} partitions, "
        f"pause_high_water={args.pause_high_water}, levels={args.levels}, "
        f"processes={args.processes}, cancelled {args.cancel_share:.0%}, commit interval "
        f"{args.commit_interval or 'default'}, median of {args.rounds} rounds"
    )
    print(f"bare consume->produce pipe : {p:>9,.0f} msg/s, catch-up {pt:.1f} s")
    goals = {"at-least-once": 0.9, "exactly-once": 0.8}
    for guarantee in args.guarantees:
        d, dt = statistics.median(rates[guarantee]), statistics.median(times[guarantee])
        ratios = ", ".join(
            f"{b / a:.2f}" for a, b in zip(pipe_rates, rates[guarantee], strict=True)
        )
        print(
            f"daemon, {guarantee:<13}: {d:>9,.0f} msg/s, ratio {d / p:.2f} "
            f"(rounds: {ratios}; target >= {goals.get(guarantee, 0):.2f}), "
            f"catch-up {dt:.1f} s = {dt / pt:.2f} x the pipe's (target <= 1.15)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
