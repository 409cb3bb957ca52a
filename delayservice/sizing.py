"""How much memory a daemon may take, from the settings it runs with.

The daemon bounds what it holds, and this adds up those bounds the way it applies them:
the held records under `max_buffered_bytes` (levels: `MemoryBudget`, which charges each
record its payload plus `RECORD_OVERHEAD`; precise mode: a cap of the same size for its
two wheels), the one record a level with nothing held may admit past the cap, the
librdkafka queues of every client it makes (read from the configs `client_config` gives
them, so a user's `[consumer]` or `[producer]` keys count), and the idle footprint.
Deploy files are checked against it (`tests/deploy/test_sizing.py`), and
docs/operations.md states it.

One measured figure backs it: `HELD_RSS_PER_RECORD`, what a held level record costs in
RSS, must stay within what the budget charges for it, or the cap would not bound RSS.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from delayservice.kafka import client_config
from delayservice.settings import Settings

MiB: Final = 1024 * 1024
HELD_RSS_PER_RECORD: Final = 597
"""Bytes of RSS per held level record with a 100 B value (164 B of payload), from
`python benchmarks/memory_per_message.py --messages 300000` (docs/performance.md, the
2026-11-26 sitting). The budget charges such a record 164 + RECORD_OVERHEAD."""
HELD_PAYLOAD_PER_RECORD: Final = 164
"""The payload the budget counts for that record (key, value and headers)."""
IDLE_RSS: Final = 64 * MiB
"""An idle daemon with the 12 default levels (`python benchmarks/idle_footprint.py`,
docs/performance.md): interpreter, code, clients and their threads."""
LARGEST_RECORD: Final = 1_048_588
"""The broker's default `message.max.bytes`: the one record a level holding nothing
admits whatever the cap."""

# librdkafka's defaults, for keys the configs leave to it.
_PREFETCH_KBYTES = 65536  # queued.max.messages.kbytes
_FETCH_MESSAGE_MAX = MiB  # fetch.message.max.bytes: librdkafka may overshoot by one fetch
_PRODUCER_KBYTES = 1_048_576  # queue.buffering.max.kbytes


def _consumer_queue(config: dict[str, Any]) -> int:
    prefetch = int(config.get("queued.max.messages.kbytes", _PREFETCH_KBYTES)) * 1024
    overshoot = int(config.get("fetch.message.max.bytes", _FETCH_MESSAGE_MAX))
    return prefetch + overshoot


def _producer_queue(config: dict[str, Any]) -> int:
    return int(config.get("queue.buffering.max.kbytes", _PRODUCER_KBYTES)) * 1024


@dataclass(frozen=True)
class MemoryBound:
    """The most one daemon process (one worker under `processes = N`) may take, by part."""

    held: int
    """Held records: levels' budget, precise mode's cap, the one record per level past it."""
    client_queues: int
    """Pre-fetched records in consumers, records on their way in producers."""
    idle: int

    @property
    def total(self) -> int:
        return self.held + self.client_queues + self.idle


def worker_bound(settings: Settings) -> MemoryBound:
    """One daemon process with these settings (a worker's: its share of the cap)."""
    cap = settings.max_buffered_bytes
    if settings.processes > 1:
        cap = max(MiB, cap // settings.processes)  # as the supervisor splits it
    levels = len(settings.level_set())
    held = cap + levels * LARGEST_RECORD
    consumer = _consumer_queue(client_config.consumer(settings, "sizing", "sizing"))
    forwarder = _producer_queue(client_config.level_producer(settings, "sizing"))
    queues = levels * (consumer + forwarder)
    if settings.precise:
        held += cap  # the two wheels' cap, separate from the levels' budget
        consumers = 2 if settings.replicas == 2 else 1  # intake, and progress with replicas
        shared = _producer_queue(client_config.producer(settings, "sizing"))
        queues += 2 * (consumers * consumer + forwarder) + shared
    return MemoryBound(held=held, client_queues=queues, idle=IDLE_RSS)


def process_bound(settings: Settings) -> int:
    """The whole instance: every worker, plus the supervisor's own footprint when there
    is one (counted as an idle daemon's, which it stays below)."""
    if settings.processes == 1:
        return worker_bound(settings).total
    return settings.processes * worker_bound(settings).total + IDLE_RSS


_SIZE = re.compile(r"(\d+)\s*([kmgt]?)i?b?", re.IGNORECASE)
_SIZE_UNITS: Final = {"": 1, "k": 1024, "m": MiB, "g": 1024 * MiB, "t": 1024 * 1024 * MiB}
_NO_LIMIT: Final = 1 << 60
"""cgroup v1 says "no limit" with a number near 2^63."""


def parse_size(text: str) -> int:
    """A memory size as systemd (`MemoryMax=2G`) and compose (`mem_limit: 512m`) write
    it: bytes, or K, M, G, T in powers of 1024."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a size like 512M or 2G")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]


def cgroup_limit(
    proc: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """The memory limit of the cgroup this process runs in, the tightest along its path
    (cgroup v2 `memory.max`, or v1 `memory.limit_in_bytes`); None when there is none or
    it cannot be read. Run under the unit or in the container, it is the daemon's."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    limits: list[int] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            base, name = root, "memory.max"
        elif "memory" in controllers.split(","):
            base, name = root / "memory", "memory.limit_in_bytes"
        else:
            continue
        here = base / path.lstrip("/")
        for folder in (here, *here.parents):
            if not folder.is_relative_to(base):
                break
            with contextlib.suppress(OSError, ValueError):
                text = (folder / name).read_text().strip()
                if text != "max" and int(text) < _NO_LIMIT:
                    limits.append(int(text))
    return min(limits, default=None)
