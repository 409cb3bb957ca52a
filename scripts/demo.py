"""The DelayService demo: a real broker, the topics, the daemon, delayed messages arriving.

Starts a local Apache Kafka (KRaft) unless --bootstrap names one, creates the level
topics, runs the daemon in this process, sends messages with delays across several
levels and a few with exact delays (precise mode), cancels one of each kind, and prints
each delivery with its lateness. Exits non-zero if any message arrives early or not at
all, or if a cancelled one arrives.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from delayservice.daemon import Daemon
from delayservice.kafka import topics
from delayservice.kafka.record_headers import header_values
from delayservice.producer import DelayProducer
from delayservice.settings import Settings
from delayservice.settings_loading import load_settings
from delayservice.testing.local_broker import LocalBroker

LEVELS = "1s,2s,5s,10s"
DELAYS = [0.5, 1, 1.5, 2, 3, 4.5, 5, 7, 10]
EXACT = [1.3, 2.75, 6.2]
READY_WITHIN_S = 60.0


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    print("starting a local Apache Kafka broker (KRaft) from Maven Central jars ...", flush=True)
    with LocalBroker() as local:
        print(f"broker ready on {local.bootstrap}", flush=True)
        yield local.bootstrap


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    parser.add_argument("--rounds", type=int, default=2, help="messages per delay")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    with broker(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory() as data_dir:
        run_id = uuid.uuid4().hex[:6]
        settings = load_settings(
            bootstrap_servers=bootstrap,
            levels=LEVELS,
            metrics_port=0,
            metrics_host="127.0.0.1",
            topic_prefix=f"demo_{run_id}_delay_",
            group_id=f"demo-{run_id}",
            dead_letter_topic=f"demo_{run_id}_dlq",
            precise=True,
            precise_topic=f"demo_{run_id}_precise",
            data_dir=data_dir,
        )
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for spec, outcome in topics.create(admin, settings):
            print(f"topic {spec.name:28} {spec.role:12} {outcome}")
        target = f"demo_{run_id}_orders"
        admin.create_topics([NewTopic(target, 3, 1)])[target].result(30)
        del admin  # its connections would outlive the broker and log refusals

        # The daemon stops before the broker does, on every path: a daemon left running
        # under a stopped broker fills the screen with connection refusals.
        daemon = Daemon(settings)
        try:
            daemon.start()
            print(
                f"daemon running: levels {settings.levels}; metrics on "
                f"http://127.0.0.1:{daemon.metrics_port}/metrics",
                flush=True,
            )
            if not wait_until_ready(daemon, READY_WITHIN_S):
                why = daemon.readiness()[1]
                print(f"the daemon was not ready within {READY_WITHIN_S:.0f} s: {why}", flush=True)
                return 1
            sent, withdrawn = send_messages(bootstrap, settings, target, args.rounds)
            report = watch(bootstrap, target, run_id, sent, withdrawn)
        finally:
            code = daemon.stop()
        print(
            f"\ndelivered {report.delivered}/{len(sent)}, early {report.early}, "
            f"missing {len(sent) - report.delivered}, cancelled arrived {report.cancelled}, "
            f"lateness max {max(report.lateness, default=0) * 1000:.0f} ms; "
            f"daemon exit code {code}"
        )
        ok = report.early == 0 and report.cancelled == 0 and report.delivered == len(sent)
        return 0 if ok and code == 0 else 1


def wait_until_ready(daemon: Daemon, within_s: float) -> bool:
    """Ready means every level owns its partitions and precise mode holds its own."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if daemon.readiness()[0]:
            return True
        time.sleep(0.1)
    return False


Sent = dict[str, tuple[float, float, str]]
"""delay-id -> (sent at, asked delay in seconds, level name or "exact")."""


def send_messages(
    bootstrap: str, settings: Settings, target: str, rounds: int
) -> tuple[Sent, set[str]]:
    """Sends the level and exact messages, then one level and one exact message and
    their cancels."""
    producer = DelayProducer({"bootstrap.servers": bootstrap}, settings=settings)
    sent: Sent = {}
    for round_no in range(rounds):
        for delay in DELAYS:
            level = settings.level_set().select(int(delay * 1000))
            mid = producer.produce(
                target,
                f"order {round_no}-{delay}".encode(),
                key=f"customer-{round_no}".encode(),
                delay=delay,
            )
            sent[mid] = (time.time(), delay, level.name)
    for round_no in range(rounds):
        for delay in EXACT:
            mid = producer.produce(
                target,
                f"reminder {round_no}-{delay}".encode(),
                key=f"customer-{round_no}".encode(),
                delay=delay,
                precision="exact",
            )
            sent[mid] = (time.time(), delay, "exact")
    withdrawn = {
        producer.produce(target, b"withdrawn", delay=3, precision="exact"),
        producer.produce(target, b"withdrawn", delay=3),
    }
    producer.flush(10)
    for message_id in withdrawn:
        producer.cancel(message_id)
    producer.flush(10)
    producer.close()
    print(
        f"sent {len(sent)} messages with delays {DELAYS} s on levels and {EXACT} s exact, "
        "and one message of each kind cancelled before its time\n"
    )
    return sent, withdrawn


@dataclass
class Report:
    delivered: int = 0
    early: int = 0
    cancelled: int = 0
    lateness: list[float] = field(default_factory=list)


def watch(bootstrap: str, target: str, run_id: str, sent: Sent, withdrawn: set[str]) -> Report:
    """Reads the target topic and prints each delivery with how late it was."""
    print(f"{'message':30} {'asked':>6} {'level':>6} {'waited':>7} {'late':>7}  partition")
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"demo-reader-{run_id}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([target])
    report = Report()
    seen: set[str] = set()
    deadline = time.monotonic() + max(DELAYS) + 30
    try:
        while len(seen) < len(sent) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            envelope = header_values(message)
            mid = (envelope.get("delay-id") or b"").decode(errors="replace")
            if mid in withdrawn:
                print("the cancelled message arrived", flush=True)
                report.cancelled += 1
                continue
            if mid not in sent or mid in seen:
                print(f"unexpected record at offset {message.offset()}: id {mid!r}", flush=True)
                continue
            due = int(envelope.get("delay-due-ms") or 0) / 1000
            forwarded = message.timestamp()[1] / 1000
            sent_at, asked, level_name = sent[mid]
            late = forwarded - due
            report.early += late < 0
            report.lateness.append(late)
            seen.add(mid)
            value = (message.value() or b"").decode(errors="replace")
            print(
                f"{value:30} {asked:>5}s {level_name:>6} "
                f"{forwarded - sent_at:>6.2f}s {late * 1000:>5.0f}ms  {message.partition()}",
                flush=True,
            )
    finally:
        consumer.close()
    report.delivered = len(seen)
    return report


if __name__ == "__main__":
    sys.exit(main())
