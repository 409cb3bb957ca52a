"""Processes, traffic and read-back for the fault-injection suite.

The daemon runs as a real subprocess (`python -m delayservice run`) so a fault hits it
the way it would in production: SIGKILL leaves no chance to commit, SIGTERM goes
through the real signal handler. Traffic comes from a background thread at a steady
pace, and everything is read back from the broker afterwards, so the verdict never
depends on what the daemon says about itself.
"""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from delayservice.kafka.record_headers import UNREADABLE, read_headers
from delayservice.ports import free_port
from delayservice.producer import DelayProducer, Precision
from delayservice.settings_loading import settings_env


def now_ms() -> int:
    """Epoch milliseconds: the broker stamps LogAppendTime with the same host clock."""
    return int(time.time() * 1000)


def scenario_name(scenario: str, guarantee: str, layout: str = "shared") -> str:
    """A scenario's row in the table; exactly-once rows are marked, and so are rows run
    with one level worker per level."""
    if layout == "per-level":
        scenario = f"{scenario} (per-level)"
    return f"{scenario} (exactly-once)" if guarantee == "exactly-once" else scenario


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """True once `condition` holds, False at the deadline: for drains, where the test
    still wants the numbers when something never arrives."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


# -- daemon processes ----------------------------------------------------------------


class DaemonProcess:
    """One `delayservice run` subprocess. Its output goes to a file: a pipe nobody reads
    fills up and would stall the daemon, which would look like a bug in the daemon."""

    def __init__(self, instance: str, env: dict[str, str], log_path: Path, port: int) -> None:
        self.instance = instance
        self.env = env
        self.log_path = log_path
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None
        self.started_ms = 0
        self.stopped_by_test = False
        self.sigterm_exit: int | None = None

    def start(self) -> DaemonProcess:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "delayservice", "run"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.started_ms = now_ms()
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ready(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.port}/readyz"
            with urllib.request.urlopen(url, timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def serving(self) -> bool:
        """Its HTTP endpoint answers, ready or not: the interpreter has imported the
        package and the daemon is starting its workers."""
        try:
            url = f"http://127.0.0.1:{self.port}/readyz"
            with urllib.request.urlopen(url, timeout=1):
                return True
        except urllib.error.HTTPError:
            return True  # 503: serving, not ready yet
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no handler runs, nothing is committed or flushed."""
        assert self.process is not None
        self.stopped_by_test = True
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def send_sigterm(self) -> None:
        assert self.process is not None
        self.stopped_by_test = True
        self.process.send_signal(signal.SIGTERM)

    def wait_sigterm(self, timeout: float) -> int | None:
        """The exit code after `send_sigterm`, or None if it overran `timeout`: then its
        stacks go to its log (`dump_stacks`), so a hung daemon says where it hung."""
        assert self.process is not None
        try:
            self.sigterm_exit = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.dump_stacks()
            self.sigterm_exit = None
        return self.sigterm_exit

    def dump_stacks(self) -> None:
        """SIGABRT with faulthandler on: every thread's Python stack lands in the log.
        For a daemon that is alive but stuck, this says where."""
        assert self.process is not None
        self.stopped_by_test = True
        self.process.send_signal(signal.SIGABRT)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)

    def exited_on_its_own(self) -> int | None:
        """The exit code if the process ended without the test asking it to."""
        if self.process is None or self.stopped_by_test:
            return None
        return self.process.poll()

    def log_tail(self, lines: int = 25) -> str:
        """The end of the log; after a crash, first the lines that say what crashed: an
        assertion (librdkafka prints one before it aborts) and faulthandler's header with
        the stack of the thread that was running, which the tail alone cuts off."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        all_lines = text.splitlines()
        return "\n".join([*crash_lines(all_lines), *all_lines[-lines:]])


CRASH_STACK_LINES = 40


def crash_lines(lines: list[str]) -> list[str]:
    """Assertion lines and the crashing thread's stack from a daemon's log, if any."""
    found = [f"[assert] {line}" for line in lines if "assert" in line.lower()]
    for i, line in enumerate(lines):
        if line.startswith("Fatal Python error"):
            found.append("[crash]")
            found.extend(lines[i : i + CRASH_STACK_LINES])
            break
    return found


@dataclass
class Fleet:
    """Every daemon one scenario starts, with a clean DELAYSERVICE_* environment."""

    settings: Any
    log_dir: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    daemons: list[DaemonProcess] = field(default_factory=list)

    def env(self, instance: str, port: int) -> dict[str, str]:
        return {
            **settings_env(
                self.settings,
                metrics_host="127.0.0.1",
                metrics_port=port,
                instance_name=instance,
                commit_interval_s=0.5,
                retry_backoff_s=0.2,
                retry_backoff_max_s=2,
                shutdown_timeout_s=15,
                log_level=self.settings.log_level,  # INFO unless a row asks
            ),
            "PYTHONFAULTHANDLER": "1",  # for `dump_stacks`
            **self.extra_env,
        }

    def spawn(self, instance: str, env: dict[str, str] | None = None) -> DaemonProcess:
        """`env`: settings of this daemon alone (a precise member's index and data dir)."""
        port = free_port()
        log = self.log_dir / f"daemon-{len(self.daemons)}-{instance}.log"
        daemon = DaemonProcess(instance, {**self.env(instance, port), **(env or {})}, log, port)
        self.daemons.append(daemon.start())
        return daemon

    def spawn_member(self, instance: str, member: int, data_dir: Path) -> DaemonProcess:
        """A precise member: its index and its own data directory."""
        return self.spawn(
            instance,
            {"DELAYSERVICE_PRECISE_MEMBER": str(member), "DELAYSERVICE_DATA_DIR": str(data_dir)},
        )

    def live(self) -> list[DaemonProcess]:
        return [d for d in self.daemons if d.alive() and not d.stopped_by_test]

    def unexpected_exits(self) -> list[str]:
        """One line per daemon that exited on its own, with the end of its log."""
        out = []
        for d in self.daemons:
            code = d.exited_on_its_own()
            if code is not None:
                out.append(f"daemon {d.instance} exited on its own with {code}:\n{d.log_tail()}")
        return out

    def stop_all(self) -> None:
        """SIGTERM every live daemon and wait for each (`sigterm_exit` says how it ended)."""
        signalled = [d for d in self.daemons if d.alive()]
        for d in signalled:
            d.send_sigterm()
        for d in signalled:
            d.wait_sigterm(30)


# -- traffic ------------------------------------------------------------------------


@dataclass(frozen=True)
class Produced:
    """What the test itself sent: the key the read-back is matched on."""

    topic: str
    partition: int
    offset: int
    good: bool


class SentLog:
    """Delivery reports of every producer in a scenario, keyed by (topic, partition,
    offset); hostile records have no usable id, so this is how they are found again."""

    def __init__(self) -> None:
        self.by_position: dict[tuple[str, int, int], Produced] = {}
        self.failed = 0
        self._lock = threading.Lock()

    def callback(self, good: bool) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, msg: Any) -> None:
            with self._lock:
                if err is not None:
                    self.failed += 1
                    return
                key = (msg.topic(), msg.partition(), msg.offset())
                self.by_position[key] = Produced(*key, good=good)

        return on_delivery

    def snapshot(self) -> dict[tuple[str, int, int], Produced]:
        with self._lock:
            return dict(self.by_position)


class Traffic:
    """Good delayed records at a steady pace from a background thread, through the
    project's DelayProducer, spread over every level and the given targets."""

    def __init__(
        self,
        bootstrap: str,
        settings: Any,
        targets: list[str],
        rate: float,
        seed: int,
        log: SentLog,
        precision: Precision = "level",
    ) -> None:
        """`precision="exact"`: every record goes to the precise topic, with a random
        delay up to the top level."""
        self._producer: DelayProducer | None = DelayProducer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True},
            settings=settings,
            precision=precision,
        )
        self._exact = precision == "exact"
        self._levels = [level.delay_ms for level in settings.level_set()]
        self._targets = list(targets)
        self._rate = rate
        self._rng = random.Random(seed)
        self._log = log
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="traffic", daemon=True)
        self.count = 0

    def set_targets(self, targets: Iterable[str]) -> None:
        with self._lock:
            self._targets = list(targets)

    def start(self) -> Traffic:
        self._thread.start()
        return self

    def _delay_ms(self) -> int:
        """A delay that selects a random level: above the level below it, at most its own."""
        if self._exact:
            return self._rng.randint(1, self._levels[-1])
        index = self._rng.randrange(len(self._levels))
        low = self._levels[index - 1] if index else 0
        return self._rng.randint(low + 1, self._levels[index])

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            with self._lock:
                target = self._rng.choice(self._targets)
            key = f"k{self._rng.randrange(500)}".encode()
            assert self._producer is not None
            self._producer.produce(
                target,
                f"v{self.count}".encode(),
                key,
                delay=self._delay_ms() / 1000,
                on_delivery=self._log.callback(good=True),
            )
            self.count += 1
            self._producer.poll(0)
            pause = started + self.count / self._rate - time.monotonic()
            if pause > 0:
                self._stop.wait(pause)  # pacing, not a wait for correctness

    def stop(self, flush_timeout: float = 120.0) -> int:
        """Stop producing and flush; returns how many records are still unacknowledged."""
        self._stop.set()
        self._thread.join(30)
        if self._producer is None:
            return 0
        unsent = self._producer.flush(flush_timeout)
        self._producer = None  # its client goes now, not when the broker is long gone
        return unsent


# -- read-back ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rec:
    """One record as the broker stored it."""

    topic: str
    partition: int
    offset: int
    ts_type: int
    ts: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    unreadable: bool = False
    """The client could not decode its headers (`record_headers`): `headers` is empty."""

    def header(self, name: str) -> bytes | None:
        """The last value of `name` (dead-letter headers are appended after the originals)."""
        found = None
        for n, v in self.headers:
            if n == name:
                found = v
        return found

    def has(self, name: str) -> bool:
        return any(n == name for n, _ in self.headers)


REBUILD_AFTER_S = 15.0
"""How long the reader's client may fail to give a partition's end before it is replaced."""


class Reader:
    """Reads whole topics from offset 0 with assign(), never through a group, so
    reading back cannot disturb the daemon's groups; call `catch_up` to read on."""

    def __init__(self, bootstrap: str, topics: Iterable[str] = ()) -> None:
        from confluent_kafka import Consumer

        self._bootstrap = bootstrap
        self._config = {
            "bootstrap.servers": bootstrap,
            "group.id": f"faults-reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            # What an exactly-once consumer of the targets sees: the duplicates
            # column counts copies that committed, not aborted attempts.
            "isolation.level": "read_committed",
        }
        self._consumer = Consumer(self._config)
        self.records: dict[str, list[Rec]] = {}
        self._assigned: dict[tuple[str, int], int] = {}  # (topic, partition) -> next offset
        self.rebuilt = 0
        """How often its client was replaced (`_end_of`)."""
        self.add(topics)

    def add(self, topics: Iterable[str]) -> None:
        from confluent_kafka import TopicPartition

        new = []
        for topic in topics:
            meta = self._consumer.list_topics(topic, timeout=15).topics[topic]
            assert meta.error is None, f"{topic}: {meta.error}"
            self.records.setdefault(topic, [])
            for p in meta.partitions:
                self._assigned[(topic, p)] = 0
                new.append(TopicPartition(topic, p, 0))
        if new:
            self._consumer.incremental_assign(new)

    def remove(self, topic: str) -> None:
        """Stop reading `topic` (it is about to be deleted); what was read stays."""
        from confluent_kafka import TopicPartition

        gone = [tp for tp in self._assigned if tp[0] == topic]
        self._consumer.incremental_unassign([TopicPartition(t, p) for t, p in gone])
        for tp in gone:
            del self._assigned[tp]

    def rename(self, topic: str, alias: str) -> None:
        """Keep records read from `topic` under `alias` (a deleted incarnation)."""
        self.records[alias] = self.records.pop(topic, [])

    def catch_up(self, timeout: float = 30.0) -> bool:
        """Read until every assigned partition reaches the end it had when called.

        Ends are taken last-added first: outputs (targets, dead letters) are added after
        the level topics, so every copy read has its source read too.
        """
        from confluent_kafka import TopicPartition

        deadline = time.monotonic() + timeout
        ends = {}
        for (topic, p), nxt in reversed(list(self._assigned.items())):
            high = self._end_of(TopicPartition(topic, p), deadline)
            if high is None:
                return False
            if high > nxt:
                ends[(topic, p)] = high
        while ends and time.monotonic() < deadline:
            for msg in self._consumer.consume(1000, 0.2):
                if msg.error() is not None:
                    continue
                tp = (msg.topic(), msg.partition())
                if tp not in self._assigned:
                    continue
                ts_type, ts = msg.timestamp()
                headers = read_headers(msg)  # a hostile name must not crash the reader
                self.records[tp[0]].append(
                    Rec(
                        tp[0],
                        tp[1],
                        msg.offset(),
                        ts_type,
                        ts,
                        msg.key(),
                        msg.value(),
                        tuple(headers) if isinstance(headers, list) else (),
                        headers is UNREADABLE,
                    )
                )
                self._assigned[tp] = msg.offset() + 1
            # The position, not the last offset read: it steps over transaction markers,
            # which are never returned (an exactly-once target ends in one).
            waiting = [TopicPartition(t, p) for t, p in ends]
            for position in self._consumer.position(waiting) if waiting else []:
                tp = (position.topic, position.partition)
                if position.offset >= ends[tp]:
                    self._assigned[tp] = max(self._assigned[tp], position.offset)
                    del ends[tp]
        return not ends

    def _end_of(self, tp: Any, deadline: float) -> int | None:
        """The partition's end offset; asked again while the broker cannot say (a
        restarted broker is not yet the leader), None at the deadline.

        After a broker froze and fenced itself on waking, this reader's client answered
        "Local: Unknown partition" for a target partition for minutes on end, while a
        fresh client's metadata named its leader every 2 s, and the scenario read as a
        daemon that forwarded nothing. librdkafka's leader lookup for this call
        (`rd_kafka_topic_partition_list_query_leaders`) takes a cached "no leader" as
        final and asks the broker nothing. So each failure refreshes the topic's
        metadata (`list_topics`), and a client that still fails is replaced
        (`_rebuild`)."""
        from confluent_kafka import KafkaException

        failing_since = None
        while True:
            try:
                return int(self._consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1])
            except KafkaException as exc:
                now = time.monotonic()
                if now > deadline:
                    return None
                failing_since = failing_since if failing_since is not None else now
                with contextlib.suppress(KafkaException):
                    self._consumer.list_topics(tp.topic, timeout=5)
                if now - failing_since > REBUILD_AFTER_S:
                    self._rebuild(f"{tp.topic}[{tp.partition}]: {exc}")
                    failing_since = None
                time.sleep(0.2)

    def _rebuild(self, why: str) -> None:
        """A new client for the same partitions, each from the next offset not read."""
        from confluent_kafka import Consumer, TopicPartition

        print(f"reader: replacing its client ({why})", flush=True)
        self.rebuilt += 1
        try:
            self._consumer.close()
        except Exception as exc:  # a wedged client may refuse even this
            print(f"reader: closing the old client: {exc}", flush=True)
        self._consumer = Consumer(self._config)
        self._consumer.incremental_assign(
            [TopicPartition(t, p, o) for (t, p), o in self._assigned.items()]
        )

    def close(self) -> None:
        self._consumer.close()
