"""Whether a delivery callback costs a forwarder, even one that reports only failures.

confluent-kafka gives every message produced with a callback (its own or the
producer's `on_delivery`) a state object, and its delivery trampoline takes the GIL
for each delivered message before it looks at `delivery.report.only.error`. This
measures what that costs on the same broker in the same run, alternating the kinds:
alone, and beside a second Python thread that never waits (the worst neighbour a
forwarder can have, which a consumer thread must not become).

    python benchmarks/delivery_reports.py [--messages 300000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from forwarding import broker

HEADERS: list[tuple[str, str | bytes | None]] = [
    ("trace", b"t" * 16),
    ("delay-id", b"0123456789abcdef0123456789abcdef"),
]


def _config(bootstrap: str, callback: bool) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 1,
        "compression.type": "none",
    }
    if callback:
        config["on_delivery"] = lambda error, message: None
        config["delivery.report.only.error"] = True
    return config


def _busy(stop: threading.Event) -> None:
    """A thread that wants the GIL all the time, as a second worker thread does."""
    total = 0
    while not stop.is_set():
        for i in range(1_000):
            total += i


def _run(bootstrap: str, topic: str, n: int, callback: bool, beside_busy: bool) -> float:
    producer = Producer(_config(bootstrap, callback))
    value = b"v" * 200
    stop = threading.Event()
    busy = threading.Thread(target=_busy, args=(stop,), daemon=True)
    if beside_busy:
        busy.start()
    started = time.perf_counter()
    produce, poll = producer.produce, producer.poll
    for i in range(n):
        while True:
            try:
                produce(topic, value, b"k%d" % (i % 1000), headers=HEADERS)
                break
            except BufferError:
                poll(0.01)  # the queue is full: let deliveries make room
        if i % 5_000 == 0:
            poll(0)
    left = producer.flush(60)
    elapsed = time.perf_counter() - started
    stop.set()
    if beside_busy:
        busy.join()
    if left:
        raise SystemExit(f"{left} messages not delivered")
    return n / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--busy-messages",
        type=int,
        default=20_000,
        help="messages per run beside the busy thread, which is far slower",
    )
    parser.add_argument("--bootstrap", help="an existing broker instead of a local one")
    args = parser.parse_args()
    kinds = [
        ("no callback", False, False),
        ("on_delivery, only errors", True, False),
        ("no callback, busy thread beside", False, True),
        ("on_delivery, only errors, busy thread beside", True, True),
    ]
    rates: dict[str, list[float]] = {name: [] for name, _, _ in kinds}
    with broker(args.bootstrap) as bootstrap:
        topic = f"dr-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
        _run(bootstrap, topic, 20_000, False, False)  # warm the broker and the page cache
        for round_ in range(1, args.rounds + 1):
            for name, callback, beside_busy in kinds:
                n = args.busy_messages if beside_busy else args.messages
                rate = _run(bootstrap, topic, n, callback, beside_busy)
                rates[name].append(rate)
                print(f"round {round_}: {name:<46} {rate:>10,.0f} msg/s", flush=True)
    print(f"\n{args.messages:,} messages of 200 B with 2 headers, acks=all, idempotent; median:")
    base = statistics.median(rates["no callback"])
    busy_base = statistics.median(rates["no callback, busy thread beside"])
    for name, _, beside_busy in kinds:
        median = statistics.median(rates[name])
        against = busy_base if beside_busy else base
        print(f"  {name:<46} {median:>10,.0f} msg/s  {median / against:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
