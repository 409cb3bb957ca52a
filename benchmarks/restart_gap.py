"""How long a reader of the target waits across a kill -9 and an immediate restart.

A load generator thread sends 200 delayed messages per second into the 1 s level
through `DelayProducer`, and a reader thread tails the target (read_committed under
exactly-once, read_uncommitted otherwise), noting when each record arrives. The daemon
runs as `python -m delayservice run` under one instance name; it is killed with
SIGKILL at a seeded moment and started again at once, `--restarts` times. For each
restart the figure is the longest gap between two arrivals around it: what the kill
and the restart cost a consumer, Python's start, the group's rejoin and (exactly-once)
fencing the killed instance's open transaction included.

    python benchmarks/restart_gap.py [--restarts 8] [--guarantee exactly-once]
"""

from __future__ import annotations

import argparse
import itertools
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from delayservice.kafka import topics
from delayservice.ports import free_port
from delayservice.producer import DelayProducer
from delayservice.settings import Settings
from delayservice.settings_loading import load_settings, settings_env

sys.path.insert(0, str(Path(__file__).parent))
from daemon_process import ready
from forwarding import broker

RATE = 200
SEED = 2_611


class Load:
    """The generator and the reader, each a thread, until `stop`."""

    def __init__(self, settings: Settings, target: str, isolation: str) -> None:
        self.arrivals: list[float] = []
        self._settings = settings
        self._target = target
        self._isolation = isolation
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._send, daemon=True),
            threading.Thread(target=self._read, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _send(self) -> None:
        producer = DelayProducer(
            {"bootstrap.servers": self._settings.bootstrap_servers, "linger.ms": 5},
            settings=self._settings,
        )
        sent, start = 0, time.monotonic()
        while not self._stop.is_set():
            for _ in range(int((time.monotonic() - start) * RATE) - sent):
                producer.produce(self._target, b"v" * 100, str(sent).encode(), delay=1.0)
                sent += 1
            producer.poll(0)
            time.sleep(0.005)
        producer.flush(30)

    def _read(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self._settings.bootstrap_servers,
                "group.id": f"restart-gap-{uuid.uuid4().hex}",
                "isolation.level": self._isolation,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 5,
            }
        )
        consumer.subscribe([self._target])
        while not self._stop.is_set():
            for message in consumer.consume(1000, 0.05):
                if message.error() is None:
                    self.arrivals.append(time.time())
        consumer.close()

    def longest_gap(self, around: float, before: float, after: float) -> float:
        window = sorted(a for a in self.arrivals if around - before < a < around + after)
        return max((b - a for a, b in itertools.pairwise(window)), default=after)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=8)
    parser.add_argument(
        "--guarantee", choices=["at-least-once", "exactly-once"], default="exactly-once"
    )
    parser.add_argument("--bootstrap", help="an existing broker instead of a local one")
    args = parser.parse_args()
    if args.restarts < 1:
        parser.error("--restarts must be at least 1")
    rng = random.Random(SEED)

    with broker(args.bootstrap) as bootstrap:
        tag = uuid.uuid4().hex[:6]
        settings = load_settings(
            bootstrap_servers=bootstrap,
            levels="1s,2s,5s",
            topic_prefix=f"restart-{tag}-",
            group_id=f"restart-{tag}",
            dead_letter_topic=f"restart-{tag}-dlq",
            guarantee=args.guarantee,
        )
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topics.create(admin, settings)
        target = f"restart-{tag}-target"
        admin.create_topics([NewTopic(target, 3, 1)])[target].result(30)
        port = free_port()
        env = settings_env(
            settings,
            instance_name=f"restart-{tag}",
            metrics_host="127.0.0.1",
            metrics_port=port,
            log_level="WARNING",
        )

        def spawn() -> subprocess.Popen[bytes]:
            command = [sys.executable, "-m", "delayservice", "run"]
            return subprocess.Popen(command, env=env)

        isolation = "read_committed" if args.guarantee == "exactly-once" else "read_uncommitted"
        load = Load(settings, target, isolation)
        daemon = spawn()
        try:
            deadline = time.monotonic() + 120
            while not ready(port):
                if daemon.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the daemon did not become ready")
                time.sleep(0.05)
            time.sleep(3)  # forwarding steadily before the first kill
            gaps = []
            for restart in range(1, args.restarts + 1):
                time.sleep(rng.uniform(1.0, 2.0))
                daemon.kill()
                daemon.wait()
                killed = time.time()
                daemon = spawn()
                time.sleep(6)
                gaps.append(load.longest_gap(killed, 1.0, 6.0))
                print(f"restart {restart}: longest gap {gaps[-1]:.2f} s", flush=True)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)
            load.stop()

    print(
        f"{args.guarantee}, {args.restarts} kill -9 and restarts, {RATE} msg/s into the 1 s "
        f"level: the {isolation} reader's longest gap per restart, median "
        f"{statistics.median(gaps):.2f} s, max {max(gaps):.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
