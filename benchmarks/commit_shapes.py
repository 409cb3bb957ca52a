"""What a read_committed reader waits for, by the shape of the forwarder's commit point.

The precise exactly-once forwarder sends what falls due inside a transaction and, at
each commit point, flushes, writes its delivery record and commits; nothing is sent
meanwhile. This sends a steady load the way it does, without the rest of the daemon,
and times each record from the moment it was due to the moment a reader in another
process sees it, for four shapes, alternated on one broker in one run:

- `plain`: an idempotent producer, no transactions, a read_uncommitted reader (the
  floor: what at-least-once pays);
- `record-last`: flush, then the delivery record, then commit (the forwarder today);
- `record-first`: the delivery record, then flush, then commit;
- `turns`: two transactional producers taking turns: one sends while the other
  flushes, writes its record and commits on a helper thread.

Producers are configured as the forwarder's (linger 1 ms, lz4, failure reports only).
`--neighbour` adds a Python thread in the sending process that computes in 2 ms bursts
half the time, as the daemon's intake and loader do beside its forwarder.

    python benchmarks/commit_shapes.py [--rate 5000] [--seconds 20] [--rounds 2]
        [--neighbour] [--hogs N] [--bootstrap HOST:PORT]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from cpu_hogs import cpu_hogs
from forwarding import broker
from precise_common import stderr
from steady_lateness import percentile

from delayservice.kafka.ready_batch import ready_batch

SHAPES = ("plain", "record-last", "record-first", "turns")
FLOOR_S = 0.02
"""The forwarder's commit floor at the default 100 ms interval (`commit_floor`)."""
RECORD = b"r" * 2_000
"""About the size of a delivery record naming 100 offsets."""


def read(bootstrap: str, topic: str, isolation: str, count: int, wait_s: float, out: Any) -> None:
    """In its own process: how late (ms) each record is when this reader sees it."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"commit-shapes-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
            "fetch.wait.max.ms": 5,
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    late: list[float] = []
    deadline = time.time() + wait_s
    while len(late) < count and time.time() < deadline:
        for message in ready_batch(consumer, 10_000, 0.05):
            if message.error() is None:
                due_ms = float((message.value() or b"0 ").split(b" ", 1)[0])
                late.append(time.time() * 1000 - due_ms)
    consumer.close()
    out.put(late)


class Lane:
    """One producer; transactional unless `plain`."""

    def __init__(self, bootstrap: str, transactional: bool, failures: list[str]) -> None:
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "linger.ms": 1,
            "compression.type": "lz4",
            "enable.idempotence": True,
            "delivery.report.only.error": True,
            "on_delivery": lambda err, _msg: failures.append(str(err)) if err else None,
        }
        if transactional:
            config |= {
                "transactional.id": f"commit-shapes-{uuid.uuid4()}",
                "transaction.timeout.ms": 10_000,
                "message.timeout.ms": 10_000,
                "retry.backoff.ms": 10,
            }
        self.producer = Producer(config)
        self.steps: list[float] = []
        if transactional:
            self.producer.init_transactions(30)
            self.producer.begin_transaction()

    def commit(self, done_topic: str, *, record_first: bool) -> None:
        started = time.monotonic()
        producer = self.producer
        if record_first:
            producer.produce(done_topic, RECORD, b"k")
        producer.flush(10)
        if not record_first:
            producer.produce(done_topic, RECORD, b"k")
        producer.commit_transaction(10)
        producer.begin_transaction()
        self.steps.append(time.monotonic() - started)


@contextlib.contextmanager
def neighbour(on: bool) -> Iterator[None]:
    """A thread that holds the GIL 2 ms at a time, half the time."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            end = time.perf_counter() + 0.002
            while time.perf_counter() < end:
                pass
            time.sleep(0.002)

    thread = threading.Thread(target=spin, daemon=True)
    if on:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if on:
            thread.join()


def send(shape: str, lanes: list[Lane], topic: str, done: str, rate: int, seconds: float) -> None:
    """Each record is produced when due (its due time is its value's first word)."""
    count = int(rate * seconds)
    start = time.time()
    sent = 0
    current = 0
    last_commit = time.monotonic()
    helper: threading.Thread | None = None
    while sent < count:
        due = min(count, int((time.time() - start) * rate))
        producer = lanes[current].producer
        while sent < due:
            producer.produce(topic, b"%.3f " % ((start + sent / rate) * 1000) + b"v" * 190)
            sent += 1
        producer.poll(0)
        if shape == "plain" or time.monotonic() - last_commit < FLOOR_S:
            time.sleep(0.001)
            continue
        if shape == "turns":
            if helper is not None and helper.is_alive():
                time.sleep(0.001)
                continue
            last_commit = time.monotonic()
            lane = lanes[current]
            helper = threading.Thread(
                target=lane.commit, args=(done,), kwargs={"record_first": True}
            )
            helper.start()
            current = 1 - current
        else:
            last_commit = time.monotonic()
            lanes[0].commit(done, record_first=shape == "record-first")
    if helper is not None:
        helper.join()
    for lane in lanes:
        if shape != "plain":
            lane.commit(done, record_first=True)
        lane.producer.flush(30)


def run(bootstrap: str, shape: str, args: argparse.Namespace) -> dict[str, float]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic, done = f"shapes-{uuid.uuid4().hex[:8]}", f"shapes-done-{uuid.uuid4().hex[:8]}"
    for future in admin.create_topics([NewTopic(topic, 3, 1), NewTopic(done, 1, 1)]).values():
        future.result()
    count = int(args.rate * args.seconds)
    results: Any = mp.get_context("spawn").Queue()
    isolation = "read_uncommitted" if shape == "plain" else "read_committed"
    reader = mp.get_context("spawn").Process(
        target=read, args=(bootstrap, topic, isolation, count, args.seconds + 60, results)
    )
    reader.start()
    failures: list[str] = []
    lanes = [
        Lane(bootstrap, shape != "plain", failures) for _ in range(2 if shape == "turns" else 1)
    ]
    time.sleep(2)  # the reader's group is formed before the first record is due
    with neighbour(args.neighbour):
        send(shape, lanes, topic, done, args.rate, args.seconds)
    late: list[float] = results.get()
    reader.join()
    steps = [s for lane in lanes for s in lane.steps]
    return {
        "seen": len(late),
        "sent": count,
        "p50": percentile(late, 0.5),
        "p99": percentile(late, 0.99),
        "max": max(late),
        "commits": len(steps),
        "commit_ms": 1000 * statistics.fmean(steps) if steps else 0.0,
        "failures": len(failures),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=5_000, help="records per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="per shape and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--neighbour", action="store_true", help="a busy thread beside")
    parser.add_argument("--hogs", type=int, default=0, help="busy processes beside")
    parser.add_argument("--bootstrap", help="an existing broker (default: start one)")
    args = parser.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = set(shapes) - set(SHAPES)
    if unknown:
        parser.error(f"unknown shapes {sorted(unknown)}; choose from {', '.join(SHAPES)}")
    rows: dict[str, list[dict[str, float]]] = {s: [] for s in shapes}
    with broker(args.bootstrap) as bootstrap, cpu_hogs(args.hogs):
        # A fresh broker loads its transaction log and forms the first groups slowly.
        warm = argparse.Namespace(**{**vars(args), "seconds": 3.0, "neighbour": False})
        run(bootstrap, "turns", warm)
        for round_ in range(1, args.rounds + 1):
            for shape in shapes:
                row = run(bootstrap, shape, args)
                rows[shape].append(row)
                stderr(
                    f"  round {round_} {shape}: p50 {row['p50']:.0f} / p99 {row['p99']:.0f} ms, "
                    f"commit point {row['commit_ms']:.1f} ms"
                )
    print(
        f"steady {args.rate:,} rec/s x {args.seconds:.0f} s, {args.rounds} rounds alternated"
        f"{', a busy thread beside' if args.neighbour else ''}"
        f"{f', {args.hogs} CPU hogs' if args.hogs else ''}; lateness as a reader sees it"
    )
    heads = " ".join(f"{h:>14s}" for h in ("p50 ms", "p99 ms", "max ms"))
    print(f"{'shape':14s} {heads} {'commit point ms':>18s}  seen/sent")
    for shape, runs in rows.items():

        def cell(key: str, runs: list[dict[str, float]] = runs) -> str:
            return ", ".join(
                f"{r[key]:.0f}" if key != "commit_ms" else f"{r[key]:.1f}" for r in runs
            )

        seen = sum(r["seen"] for r in runs)
        sent = sum(r["sent"] for r in runs)
        failed = sum(r["failures"] for r in runs)
        print(
            f"{shape:14s} {cell('p50'):>14s} {cell('p99'):>14s} {cell('max'):>14s} "
            f"{cell('commit_ms'):>18s}  {seen:,}/{sent:,}{f', {failed} failed' if failed else ''}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
