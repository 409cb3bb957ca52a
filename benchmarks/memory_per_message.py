"""Memory per buffered message: what one record held by a level worker costs the daemon.

A real daemon with one level of 1h runs on a real broker; records that will not be due
for an hour are written to its level topic, so every one stays buffered (the pause
water marks and the byte cap are raised out of the way). The buffer is filled in two
equal steps and the growth between them is divided by the records added, which leaves
out the fixed cost of the clients and threads. Three figures per message:

- payload: value + a fixed allowance for key and headers, what
  delayservice_buffered_bytes counts;
- Python heap (tracemalloc): what Python allocates per record (the client's message
  object is allocated by librdkafka and the extension, mostly outside it; its slot in
  the partition's deque is);
- RSS: the process as the kernel sees it, including allocator slack.

Records are those of benchmarks/forwarding.py: a short key, a value of --value-bytes
and the envelope headers plus one user header (about 110 header bytes).

    python benchmarks/memory_per_message.py [--messages 100000] [--value-bytes 100]
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import sys
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from delayservice.daemon import Daemon
from delayservice.kafka import client_config, topics
from delayservice.level.level_worker import LevelWorker
from delayservice.settings import Settings
from delayservice.settings_loading import load_settings

sys.path.insert(0, str(Path(__file__).parent))
from forwarding import broker, fill  # the records of the throughput benchmark

GiB = 1024**3


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def settings_for(bootstrap: str, messages: int) -> Settings:
    tag = uuid.uuid4().hex[:8]
    return load_settings(
        bootstrap_servers=bootstrap,
        levels="1h",
        topic_prefix=f"mem-{tag}-",
        dead_letter_topic=f"mem-dlq-{tag}",
        group_id=f"mem-{tag}",
        partitions=3,
        pause_high_water=messages + 1,
        pause_low_water=messages,
        max_buffered_bytes=16 * GiB,
        metrics_host="127.0.0.1",
        metrics_port=0,
    )


def fill_and_wait(
    daemon: Daemon, bootstrap: str, count: int, value_bytes: int, expect: int
) -> dict[str, float]:
    """Write `count` records from a child process, wait until `expect` are buffered."""
    worker = daemon.workers[0]
    assert isinstance(worker, LevelWorker), "the first worker is a level's"
    group = worker.group
    topic = worker.level.topic
    child = multiprocessing.get_context("spawn").Process(
        target=fill, args=(bootstrap, topic, "never-forwarded", count, value_bytes)
    )
    child.start()
    child.join()
    assert child.exitcode == 0, "the filler failed"
    deadline = time.monotonic() + 600
    while group.total_buffered < expect:
        if time.monotonic() > deadline:
            raise TimeoutError(f"buffered {group.total_buffered} of {expect}")
        time.sleep(0.2)
    gc.collect()
    return {
        "buffered": group.total_buffered,
        "payload": group.total_bytes,
        "python": tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0,
        "rss": rss_bytes(),
    }


def measure(bootstrap: str, messages: int, value_bytes: int, trace: bool) -> dict[str, float]:
    """One daemon, filled in two steps: growth per added message (a fresh process each)."""
    settings = settings_for(bootstrap, messages)
    topics.create(AdminClient(client_config.admin(settings)), settings)
    if trace:
        tracemalloc.start()
    daemon = Daemon(settings)
    daemon.start()
    half = messages // 2
    try:
        first = fill_and_wait(daemon, bootstrap, half, value_bytes, half)
        second = fill_and_wait(daemon, bootstrap, half, value_bytes, 2 * half)
    finally:
        daemon.stop()
    added = second["buffered"] - first["buffered"]
    return {key: (second[key] - first[key]) / added for key in ("payload", "python", "rss")}


def _measure_into(results: Any, *args: Any) -> None:
    results.put(measure(*args))


def measure_in_child(
    bootstrap: str, messages: int, value_bytes: int, trace: bool
) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(
        target=_measure_into, args=(results, bootstrap, messages, value_bytes, trace)
    )
    child.start()
    result: dict[str, float] = results.get(timeout=1800)
    child.join()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--bootstrap", help="an existing broker (default: start a local one)")
    args = parser.parse_args()
    with broker(args.bootstrap) as bootstrap:
        # RSS without tracemalloc, whose own bookkeeping would inflate it; heap with it.
        plain = measure_in_child(bootstrap, args.messages, args.value_bytes, trace=False)
        traced = measure_in_child(bootstrap, args.messages, args.value_bytes, trace=True)
    result = {
        "messages": args.messages,
        "value_bytes": args.value_bytes,
        "payload_bytes_per_message": round(plain["payload"]),
        "python_heap_bytes_per_message": round(traced["python"]),
        "rss_bytes_per_message": round(plain["rss"]),
    }
    print(f"{args.messages} buffered records with a {args.value_bytes}-byte value, per message:")
    for key in ("payload", "python_heap", "rss"):
        print(f"  {key.replace('_', ' '):12} {result[f'{key}_bytes_per_message']:>6} bytes")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
