"""The fault suite at full load: a backlog all due at once, forwarded as fast as the
daemon can, with the fault striking mid-way.

At the 60-80 msg/s of the other scenarios the daemon's producer never waits for room in
its local queue, nor has thousands of records in flight when a fault strikes, so the
paths a backlog takes (a full queue, refusals while it waits, in-flight records timing
out) never run on a real broker. Here `BACKLOG` records are written to one level before
the daemon starts, so all of them are due when it reads them, and each scenario checks
from the daemon's own /metrics that its producer did find the queue full.
"""

from __future__ import annotations

import random
import threading
import time
import urllib.request
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from delayservice.producer import DelayProducer
from tests.faults.harness import DaemonProcess, SentLog, wait_until

BACKLOG = 300_000
"""Records due at once: several times the producer's local queue, so it fills."""
DELAY_S = 1.0
QUEUE_FULL = "delayservice_producer_queue_full_total"


def write_backlog(bootstrap: str, settings: Any, target: str, sent: SentLog, seed: int) -> None:
    """`BACKLOG` delayed records for `target` through the SDK, as fast as it goes; every
    one acknowledged (the harness matches them by position)."""
    rng = random.Random(seed)
    with DelayProducer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 2 * BACKLOG,
            "queue.buffering.max.kbytes": 1_048_576,
            "enable.idempotence": True,
        },
        settings=settings,
    ) as producer:
        on_delivery = sent.callback(good=True)
        for count in range(BACKLOG):
            key = f"k{rng.randrange(5_000)}".encode()
            value = f"v{count}".encode()
            producer.produce(target, value, key, delay=DELAY_S, on_delivery=on_delivery)
            if count % 10_000 == 0:
                producer.poll(0)
        unsent = producer.flush(120)
    assert unsent == 0, f"{unsent} backlog records never reached the level topic"
    assert sent.failed == 0, f"{sent.failed} backlog records were refused"


class TargetCount:
    """How many records a topic holds (its end offsets), for deciding when to strike."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "full-load-count"})
        self._topic = topic

    def now(self) -> int:
        meta = self._consumer.list_topics(self._topic, timeout=10).topics[self._topic]
        total = 0
        for partition in meta.partitions:
            _, high = self._consumer.get_watermark_offsets(
                TopicPartition(self._topic, partition), timeout=10, cached=False
            )
            total += max(0, high)
        return total

    def wait_for(self, count: int, timeout: float) -> int:
        """Until the topic holds `count` records; returns what it holds then."""
        seen = [0]

        def reached() -> bool:
            seen[0] = self.now()
            return seen[0] >= count

        assert wait_until(reached, timeout, interval=0.05), (
            f"{self._topic} reached {seen[0]} of {count} records in {timeout:.0f}s"
        )
        return seen[0]

    def close(self) -> None:
        self._consumer.close()


class OpenTransactions:
    """Which partitions of a topic end in records of a transaction neither committed nor
    aborted: their high watermark (what a read_uncommitted client sees) is past their
    last stable offset (read_committed). Such records cannot be read, so a test that
    must count what a topic holds before deleting it waits until there are none."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._topic = topic
        self._clients = {
            level: Consumer(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": "full-load-open-transactions",
                    "isolation.level": level,
                }
            )
            for level in ("read_committed", "read_uncommitted")
        }

    def partitions(self) -> list[int]:
        client = self._clients["read_uncommitted"]
        meta = client.list_topics(self._topic, timeout=10).topics[self._topic]
        open_ones = []
        for partition in sorted(meta.partitions):
            tp = TopicPartition(self._topic, partition)
            stable, high = (
                self._clients[level].get_watermark_offsets(tp, timeout=10, cached=False)[1]
                for level in ("read_committed", "read_uncommitted")
            )
            if high > stable:
                open_ones.append(partition)
        return open_ones

    def close(self) -> None:
        for client in self._clients.values():
            client.close()


def metric_total(daemon: DaemonProcess, name: str) -> float:
    """The sum of every sample of `name` on the daemon's /metrics (0 when absent)."""
    url = f"http://127.0.0.1:{daemon.port}/metrics"
    total = 0.0
    with urllib.request.urlopen(url, timeout=5) as reply:  # loopback
        for line in reply.read().decode().splitlines():
            if line.startswith((f"{name} ", f"{name}{{")):
                total += float(line.rsplit(" ", 1)[1])
    return total


def queue_filled(*daemons: DaemonProcess) -> float:
    """How often the live ones among `daemons` found their producer's queue full."""
    return sum(metric_total(d, QUEUE_FULL) for d in daemons if d.alive())


class LeaderWatch:
    """Which partitions of `topics` the broker says have no leader, sampled every
    `every_s` from a thread of its own until `stop`. Right after a thaw the broker
    fences itself and a partition may have no leader for a moment: a client whose
    metadata was refreshed then can keep that answer (see `Reader._end_of`), and a
    partition left without a leader for longer would hold any producer. The report
    says how long any went leaderless."""

    def __init__(self, bootstrap: str, topics: list[str], every_s: float = 2.0) -> None:
        self._admin = AdminClient({"bootstrap.servers": bootstrap})
        self._topics = topics
        self._every = every_s
        self._stop = threading.Event()
        self._since: dict[tuple[str, int], float] = {}
        self.longest: tuple[float, str] = (0.0, "")
        self.unanswered = 0
        self._thread = threading.Thread(target=self._run, name="leader-watch", daemon=True)

    def start(self) -> LeaderWatch:
        self._thread.start()
        return self

    def stop(self) -> str:
        """Stop sampling; the line for the report."""
        self._stop.set()
        self._thread.join(30)
        seconds, where = self.longest
        span = f"for {seconds:.0f} s" if seconds >= self._every else "in one sample"
        said = (
            f"a partition without a leader after the thaw {span} ({where})"
            if where
            else "every partition had a leader whenever asked after the thaw"
        )
        if self.unanswered:
            said += f"; {self.unanswered} metadata requests unanswered"
        return said

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self._every)

    def _sample(self) -> None:
        try:
            metadata = self._admin.list_topics(timeout=5)
        except KafkaException:
            self.unanswered += 1
            return
        now = time.monotonic()
        leaderless = set()
        for topic in self._topics:
            described = metadata.topics.get(topic)
            if described is None:
                continue
            for partition, state in described.partitions.items():
                if state.leader < 0 or state.error is not None:
                    leaderless.add((topic, partition))
        for tp in list(self._since):
            if tp not in leaderless:
                print(f"leader-watch: {tp[0]}[{tp[1]}] has a leader again")
                del self._since[tp]
        for tp in leaderless:
            if tp not in self._since:  # at once: a test that times out loses its report
                print(f"leader-watch: {tp[0]}[{tp[1]}] has no leader")
            since = self._since.setdefault(tp, now)
            if now - since >= self.longest[0]:
                self.longest = (now - since, f"{tp[0]}[{tp[1]}]")
