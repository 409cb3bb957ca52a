"""`delayservice find` over a level topic holding many records, against the scan a user
would write by hand.

Kafka has no index by header, so a lookup by id reads the window. This writes
`--messages` envelope records (100 B values) to the longest level, then times, from
outside the process as a user sees it, `delayservice find` for the last id written and
for an id that is not there; and, on the same records in the same run, the bare scan:
one consumer reading every partition from the window's start, `consume(10000)` and a
look at each record's `delay-id` header, stopping at the end offsets.

    python benchmarks/find_by_id.py [--messages 1000000] [--bootstrap host:port]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import cast

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from forwarding import broker

from delayservice.envelope import Envelope, wrap
from delayservice.kafka import topics
from delayservice.settings_loading import load_settings, settings_env


def write(bootstrap: str, topic: str, target: str, count: int) -> str:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 50, "compression.type": "lz4"}
    )
    last = ""
    for i in range(count):
        last = uuid.uuid4().hex
        headers = wrap(Envelope(target, 3_600_000, last), None)
        while True:
            try:
                producer.produce(topic, b"v" * 100, headers=headers, partition=i % 3)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush(120)
    return last


def bare_scan(bootstrap: str, topic: str, wanted: str, since_ms: int) -> float:
    started = time.monotonic()
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "enable.auto.commit": False}
    )
    parts = list(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    starts = consumer.offsets_for_times([TopicPartition(topic, p, since_ms) for p in parts], 10)
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in parts}
    consumer.assign(starts)
    left = {tp.partition for tp in starts if tp.offset < ends[tp.partition]}
    needle = wanted.encode()
    while left:
        for message in consumer.consume(10_000, 1.0):
            if message.error():
                continue
            headers = cast("list[tuple[str, bytes]]", message.headers() or [])
            if ("delay-id", needle) in headers:
                pass  # found: a hand-written scan reads on to the end offsets too
            partition, offset = message.partition() or 0, message.offset() or 0
            if offset + 1 >= ends[partition]:
                left.discard(partition)
    consumer.close()
    return time.monotonic() - started


def timed_find(env: dict[str, str], message_id: str) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "delayservice", "find", message_id, "--since", "1h"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return time.monotonic() - started, done.stdout.splitlines()[0] if done.stdout else done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--bootstrap", default=os.environ.get("DELAYSERVICE_TEST_BOOTSTRAP"))
    args = parser.parse_args()
    with broker(args.bootstrap) as bootstrap:
        tag = uuid.uuid4().hex[:6]
        settings = load_settings(
            bootstrap_servers=bootstrap,
            levels="5s,1h",
            topic_prefix=f"find_{tag}_",
            dead_letter_topic=f"find_{tag}_dead",
            group_id=f"find-{tag}",
        )
        topics.create(AdminClient({"bootstrap.servers": bootstrap}), settings)
        level = settings.level_set().select(3_600_000).topic
        since_ms = int(time.time() * 1000) - 1000
        started = time.monotonic()
        last = write(bootstrap, level, f"find_{tag}_target", args.messages)
        print(f"wrote {args.messages:,} records to {level} in {time.monotonic() - started:.1f} s")
        env = {**os.environ, **settings_env(settings), "PYTHONPATH": str(Path(__file__).parents[1])}
        bare = bare_scan(bootstrap, level, last, since_ms)
        found_s, found = timed_find(env, last)
        rate = args.messages / found_s
        missing_s, missing = timed_find(env, "f" * 32)
        times = f"{found_s:.1f} s ({rate:,.0f} records/s, {found_s / bare:.2f}x the bare scan)"
        print(f"bare scan (consume + header check): {bare:.1f} s")
        print(f"delayservice find, last id: {times}: {found}")
        print(f"delayservice find, unknown: {missing_s:.1f} s ({missing_s / bare:.2f}x): {missing}")


if __name__ == "__main__":
    main()
