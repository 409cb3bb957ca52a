"""Shared parts of the precise-mode benchmarks (precise_lateness, precise_burst,
precise_memory): settings and topics, a daemon whose log goes to a file, the broker-side
reading and the join by `delay-id`, and what is sampled from /proc.

Every due time is computed here from the broker's clock, never taken from the daemon:

    due      = append time on the delay topic + max(floor, delay-ms), or delay-due-ms
               when that is later (floor: the level's delay in level mode, 0 in precise)
    lateness = append time on the target - due      (negative = early)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).parent))
from daemon_process import metrics_port, running_daemon, scrape
from forwarding import LOG_APPEND, topic_ends
from steady_lateness import percentile

from delayservice.envelope import H_DELAY_MS, H_DUE_MS, H_ID
from delayservice.kafka import topics
from delayservice.kafka.record_headers import header_values
from delayservice.settings import Settings
from delayservice.settings_loading import load_settings

MiB = 1024 * 1024


def stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Ticker:
    """Progress lines on stderr, at most one per `every` seconds."""

    def __init__(self, every: float = 3.0) -> None:
        self.every = every
        self._next = time.monotonic() + every

    def __call__(self, line: str) -> None:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.every
            stderr(line)


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"


# -- setup -----------------------------------------------------------------------------
def precise_settings(bootstrap: str, tag: str, data_dir: Path, **overrides: Any) -> Settings:
    """Settings for one run: every topic and group name carries `tag`."""
    values: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "levels": "1s",
        "topic_prefix": f"{tag}-",
        "group_id": tag,
        "dead_letter_topic": f"{tag}-dlq",
        "precise": True,
        "precise_topic": f"{tag}-precise",
        "data_dir": data_dir,
    }
    values.update(overrides)
    return load_settings(**values)


def create_topics(settings: Settings, targets: Iterable[str], partitions: int) -> None:
    """The service's topics (`delayservice topics create`) and LogAppendTime targets."""
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    topics.create(admin, settings)
    for name in targets:
        new = NewTopic(name, partitions, 1, config=LOG_APPEND)
        admin.create_topics([new])[name].result(30)


def tag_for(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def data_dir(kind: str) -> Iterator[Path]:
    """A temporary data directory for the wheel, removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix=f"delayservice-{kind}-"))
    try:
        yield root / "data"
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _output_to(fd: int) -> Iterator[None]:
    """Point this process's stdout and stderr at `fd` (so a child started meanwhile
    inherits it), and back."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for target, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, target)
            os.close(copy)


@contextlib.contextmanager
def logged_daemon(
    settings: Settings,
    instance: str,
    log_path: Path,
    ready_within: float = 120.0,
    on_start: Callable[[Any], None] | None = None,
    ready_poll_s: float = 0.2,
) -> Iterator[Any]:
    """`running_daemon` with the daemon's output (WARNING and above) in `log_path`."""
    with contextlib.ExitStack() as stack:
        with log_path.open("ab") as log, _output_to(log.fileno()):
            process = stack.enter_context(
                running_daemon(
                    settings,
                    instance,
                    ready_within=ready_within,
                    on_start=on_start,
                    ready_poll_s=ready_poll_s,
                )
            )
        yield process
    if process.returncode != 0:
        stderr(f"the daemon exited with {process.returncode}")


def log_problems(log_path: Path, show: int = 5) -> tuple[int, list[str]]:
    """Lines of the daemon's log that report a warning, an error or a traceback."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return 0, []
    bad = [
        line
        for line in lines
        if " WARNING " in line or " ERROR " in line or " CRITICAL " in line or "Traceback" in line
    ]
    return len(bad), bad[:show]


def report_log(log_path: Path) -> int:
    count, first = log_problems(log_path)
    print(f"daemon log: {count} warning/error lines ({log_path})")
    for line in first:
        print(f"  {line[:200]}")
    return count


# -- from outside the daemon -------------------------------------------------------------
def vm_rss(pid: int) -> int | None:
    """Resident set size of a live process in bytes, None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssSampler:
    """VmRSS of a process every `interval` seconds on a thread of its own."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = vm_rss(self.pid)
            if rss is not None:
                self.samples.append((time.monotonic(), rss))
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak(self) -> int:
        return max((rss for _, rss in self.samples), default=0)

    @property
    def last(self) -> int:
        return self.samples[-1][1] if self.samples else 0


class MetricsSampler:
    """Chosen series of the daemon's /metrics every `interval` seconds, on a thread of
    its own: (epoch seconds, {series: value}) per sample."""

    def __init__(self, pid: int, series: Iterable[str], interval: float = 0.2) -> None:
        self.port = metrics_port(pid)
        self.series = list(series)
        self.interval = interval
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                values = scrape(self.port)
                self.samples.append((time.time(), {s: values.get(s, 0.0) for s in self.series}))
            self._stop.wait(self.interval)

    def __enter__(self) -> MetricsSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def first(self, series: str, at_least: float) -> float | None:
        """When `series` first reached `at_least` (epoch seconds), or None."""
        return next((t for t, v in self.samples if v[series] >= at_least), None)


# -- on the broker ---------------------------------------------------------------------
def _consumer(bootstrap: str, group: str | None = None) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group or f"precise-bench-read-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            # What a consumer of an exactly-once daemon's targets sees; the same as
            # read_uncommitted for topics written without transactions.
            "isolation.level": "read_committed",
        }
    )


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = _consumer(bootstrap)
    try:
        return topic_ends(consumer, topic)
    finally:
        consumer.close()


def record_count(bootstrap: str, topic: str) -> int:
    """Records on `topic` (nothing is deleted during a run)."""
    return sum(end_offsets(bootstrap, topic).values())


class CommittedReader:
    """The offsets a group has committed on a topic, read without joining the group.

    One client for every poll: a fresh client per call spends its first seconds finding
    the coordinator, which on a busy host hid whole tenths of an intake's progress."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self._consumer = _consumer(bootstrap, group)
        self._topic = topic

    def __call__(self, partitions: Iterable[int]) -> dict[int, int]:
        wanted = [TopicPartition(self._topic, p) for p in partitions]
        return {
            tp.partition: max(0, tp.offset) for tp in self._consumer.committed(wanted, timeout=10)
        }

    def close(self) -> None:
        self._consumer.close()


def committed(bootstrap: str, group: str, topic: str, partitions: Iterable[int]) -> dict[int, int]:
    """The offsets `group` has committed on `topic` (0 where nothing is), once."""
    reader = CommittedReader(bootstrap, group, topic)
    try:
        return reader(partitions)
    finally:
        reader.close()


class Seen(NamedTuple):
    """One record as the broker holds it."""

    message_id: bytes | None
    append_ms: int
    delay_ms: int
    due_ms: int | None  # the `delay-due-ms` header


def read_topic(bootstrap: str, topic: str, starts: dict[int, int] | None = None) -> list[Seen]:
    """Every record of `topic` (from `starts` per partition when given), read by
    assignment to the end offsets of now (read_committed: until each partition's
    position, which steps over transaction markers, reaches its end)."""
    starts = starts or {}
    ends = {p: end for p, end in end_offsets(bootstrap, topic).items() if end > starts.get(p, 0)}
    total = sum(end - starts.get(p, 0) for p, end in ends.items())
    consumer = _consumer(bootstrap)
    consumer.assign([TopicPartition(topic, p, starts.get(p, 0)) for p in ends])
    out: list[Seen] = []
    tick = Ticker()
    try:
        while ends:
            for message in consumer.consume(10_000, 1.0):
                if message.error() is not None:
                    continue
                ts_type, ts = message.timestamp()
                if ts_type != TIMESTAMP_LOG_APPEND_TIME:
                    raise RuntimeError(f"{topic} must use LogAppendTime")
                headers = header_values(message)
                delay = headers.get(H_DELAY_MS)
                due = headers.get(H_DUE_MS)
                out.append(Seen(headers.get(H_ID), ts, int(delay or 0), int(due) if due else None))
            for position in consumer.position([TopicPartition(topic, p) for p in ends]):
                if position.offset >= ends[position.partition]:
                    del ends[position.partition]
            tick(f"  reading {topic}: {len(out):,} of {total:,} records")
    finally:
        consumer.close()
    return out


def bare_consume_rate(bootstrap: str, topic: str, ends: dict[int, int]) -> float:
    """Records per second a bare consumer reads `topic` to `ends` at, touching each
    record's headers once (as any reader of an envelope must) and nothing else: the
    baseline an intake is measured against, in the same run on the same broker."""
    consumer = _consumer(bootstrap)
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    left = sum(ends.values())
    started = time.monotonic()
    try:
        while left > 0:
            for message in consumer.consume(2_000, 1.0):
                if message.error() is None:
                    message.headers()
                    left -= 1
            if time.monotonic() - started > 600:
                raise SystemExit(f"the bare consumer stalled with {left:,} records left")
        return sum(ends.values()) / (time.monotonic() - started)
    finally:
        consumer.close()


def wait_for_count(
    bootstrap: str, topic: str, expected: int, deadline: float, what: str = "arrived"
) -> int:
    """Poll the end offsets of `topic` until it holds `expected` records or the
    monotonic `deadline` passes; returns the last count. Under exactly-once the end
    offsets count transaction markers too: `wait_for_ids` counts what committed."""
    tick = Ticker()
    started = time.monotonic()
    count = record_count(bootstrap, topic)
    while count < expected and time.monotonic() < deadline:
        time.sleep(0.5)
        count = record_count(bootstrap, topic)
        tick(f"  {count:,} of {expected:,} {what} after {time.monotonic() - started:.0f} s")
    return count


def wait_for_ids(bootstrap: str, topic: str, expected: int, deadline: float) -> int:
    """Like `wait_for_count`, but counts distinct `delay-id`s: after a kill -9 some
    records arrive twice, and a count of records would stop before the last arrive."""
    wait_for_count(bootstrap, topic, expected, deadline)
    while True:  # the whole topic each time: these runs hold a few thousand records
        seen = {r.message_id for r in read_topic(bootstrap, topic) if r.message_id is not None}
        if len(seen) >= expected or time.monotonic() >= deadline:
            return len(seen)
        time.sleep(0.5)


# -- the join ----------------------------------------------------------------------------
def due_ms(source: Seen, floor_ms: int = 0) -> int:
    due = source.append_ms + max(floor_ms, source.delay_ms)
    return max(due, source.due_ms) if source.due_ms is not None else due


class Joined(NamedTuple):
    lateness: list[int]  # ms, per delivered message (its first arrival)
    early: int
    lost: int
    duplicates: int
    arrivals: list[int]  # append times on the target, of first arrivals


def join(dues: dict[bytes, int], targets: list[Seen]) -> Joined:
    """First arrival of each message against its due time."""
    first: dict[bytes, int] = {}
    duplicates = 0
    for seen in targets:
        if seen.message_id is None or seen.message_id not in dues:
            continue
        if seen.message_id in first:
            duplicates += 1
            first[seen.message_id] = min(first[seen.message_id], seen.append_ms)
        else:
            first[seen.message_id] = seen.append_ms
    lateness = [ts - dues[mid] for mid, ts in first.items()]
    return Joined(
        lateness,
        sum(1 for late in lateness if late < 0),
        len(dues) - len(first),
        duplicates,
        list(first.values()),
    )


def pct(values: list[int], q: float) -> float:
    if len(values) < 2:
        return float(values[0]) if values else float("nan")
    return percentile([float(v) for v in values], q)
