"""Forwarding throughput: the daemon against a plain consume->produce pipe.

Both read the same number of records (same size, same headers) from a topic and
re-publish them with the same librdkafka settings (acks=all, idempotence, lz4,
linger 5 ms), on the same broker in the same run, alternating rounds. The daemon's
records are already due when it starts, so the figure is its forwarding cost: envelope
parsing, the per-level heap, the ledger, flow control and commit bookkeeping.
Each rate runs from partition assignment to the last broker acknowledgement.

    python benchmarks/forwarding.py [--messages 100000] [--rounds 3] [--bootstrap HOST:PORT]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Iterator

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from delayservice.daemon import Daemon
from delayservice.envelope import Envelope, forwarded_headers, unwrap, wrap
from delayservice.kafka import client_config, topics
from delayservice.kafka.local_broker import LocalBroker
from delayservice.settings import Settings, load_settings

PARTITIONS = 3


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    with LocalBroker(heap="1g") as local:
        yield local.bootstrap


def fill(bootstrap: str, topic: str, target: str, count: int, size: int) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 200_000,
        }
    )
    value = b"v" * size
    for i in range(count):
        headers = wrap(Envelope(target, 1000, uuid.uuid4().hex), [("trace", b"abc")])
        while True:
            try:
                producer.produce(topic, value, str(i % 10_000).encode(), headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)


def pipe(settings: Settings, source: str, count: int) -> float:
    """The baseline: what any Python consume->produce service does per record."""
    tag = uuid.uuid4().hex[:6]
    producer = Producer(client_config.producer(settings, f"pipe-{tag}"))
    consumer = Consumer(client_config.consumer(settings, f"pipe-{tag}", f"pipe-{tag}"))
    acked = 0
    started = threading.Event()
    t0 = 0.0

    def assigned(_c: Consumer, _p: list[TopicPartition]) -> None:
        nonlocal t0
        if not started.is_set():
            t0 = time.perf_counter()
            started.set()

    def delivered(err: object, _msg: object) -> None:
        nonlocal acked
        if err is None:
            acked += 1

    consumer.subscribe([source], on_assign=assigned)
    next_commit = time.monotonic() + 1
    while acked < count:
        for message in consumer.consume(500, 0.2):
            if message.error():
                continue
            envelope, user, _size = unwrap(message.headers())
            due = message.timestamp()[1] + 1000
            while True:
                try:
                    producer.produce(
                        envelope.target,
                        message.value(),
                        message.key(),
                        headers=forwarded_headers(user, envelope, due),
                        on_delivery=delivered,
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
        if time.monotonic() > next_commit:
            consumer.commit(asynchronous=True)
            next_commit = time.monotonic() + 1
    elapsed = time.perf_counter() - t0
    consumer.close()
    producer.flush(10)
    return count / elapsed


def daemon_rate(settings: Settings, count: int) -> tuple[float, int]:
    daemon = Daemon(settings)
    daemon.start()
    worker = daemon.workers[0]
    while not worker.ledger.partitions:
        time.sleep(0.001)
    t0 = time.perf_counter()
    while worker.ledger.forwarded < count:
        time.sleep(0.01)
    elapsed = time.perf_counter() - t0
    peak = worker.ledger.peak_partition_buffered
    daemon.stop()
    return count / elapsed, peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=200, help="value bytes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scheduler", choices=["heap", "wheel"], default="heap")
    parser.add_argument(
        "--pause-high-water",
        type=int,
        default=10_000,
        help="per-partition buffer bound; small values measure backpressure",
    )
    parser.add_argument("--bootstrap")
    args = parser.parse_args()

    with broker(args.bootstrap) as bootstrap:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        pipe_rates, daemon_rates, peaks = [], [], []
        for round_no in range(1, args.rounds + 1):
            tag = uuid.uuid4().hex[:6]
            settings = load_settings(
                bootstrap_servers=bootstrap,
                levels="1s",
                topic_prefix=f"bench-{tag}-",
                group_id=f"bench-{tag}",
                dead_letter_topic=f"bench-{tag}-dlq",
                partitions=PARTITIONS,
                metrics_port=0,
                metrics_host="127.0.0.1",
                scheduler=args.scheduler,
                pause_high_water=args.pause_high_water,
                pause_low_water=args.pause_high_water // 2,
            )
            topics.create(admin, settings)
            source, target_a, target_b = (
                f"bench-{tag}-src",
                f"bench-{tag}-out-a",
                f"bench-{tag}-out-b",
            )
            for name in (source, target_a, target_b):
                admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(30)
            fill(bootstrap, source, target_a, args.messages, args.size)
            fill(bootstrap, f"{settings.topic_prefix}1", target_b, args.messages, args.size)
            time.sleep(1.0)  # the level is 1 s: let every record become due before timing starts
            pipe_rates.append(pipe(settings, source, args.messages))
            rate, peak = daemon_rate(settings, args.messages)
            daemon_rates.append(rate)
            peaks.append(peak)
            print(
                f"round {round_no}: pipe {pipe_rates[-1]:>9,.0f} msg/s   "
                f"daemon {rate:>9,.0f} msg/s   ratio {rate / pipe_rates[-1]:.2f}",
                flush=True,
            )
        p, d = statistics.median(pipe_rates), statistics.median(daemon_rates)
        print(
            f"\n{args.messages:,} records of {args.size} B, {PARTITIONS} partitions, "
            f"scheduler={args.scheduler}, median of {args.rounds} rounds"
        )
        print(f"plain consume->produce pipe : {p:>9,.0f} msg/s")
        print(f"DelayService daemon         : {d:>9,.0f} msg/s")
        print(f"ratio daemon / pipe         : {d / p:.2f}  (target >= 0.80)")
        print(
            f"peak buffered per partition : {max(peaks)} (pause_high_water {args.pause_high_water})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
