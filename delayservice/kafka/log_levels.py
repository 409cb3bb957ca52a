"""How loud a librdkafka log line is: a fresh broker's normal start-up is not a warning.

librdkafka logs some conditions at WARNING that every new cluster (and every broker
restart) goes through for a second or two while it loads its internal logs, and then
retries on its own. A new user reading `WARNING ... Coordinator load in progress` in the
demo cannot tell that from a fault. The table below names those conditions by facility
and error text, each with why it is transient; such a line is logged at INFO instead.

A transient condition that lasts is no longer start-up: once the same facility and
error have repeated for longer than the grace period without a quiet gap of that
length, the line keeps librdkafka's own level. Everything not in the table keeps it
always. Leader elections of a brand-new topic need no entry: librdkafka retries those
(fetch, produce, metadata) at DEBUG already.

A fence is a fault, except for a producer whose transactional id another holder shares
by design (`forward.producer_rebuild.SharedId`: a precise owner and the replica that takes its
partitions over): there, librdkafka's CRITICAL lines about it are a takeover going as
planned, and `ExpectedFences` logs them at WARNING (the forwarder's own line names who
fenced it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from delayservice.kafka.client_lines import ClientLines

_COORDINATOR_STARTING = (
    "Coordinator load in progress",
    "Coordinator not available",
    "Not coordinator",
)
"""librdkafka's texts for a coordinator that is still being elected or still loading
its log (COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR)."""


FENCED_TEXTS = (
    "fenced by a newer instance",  # _FENCED, librdkafka's own
    "fences the current one",  # PRODUCER_FENCED
    "operation with an old epoch",  # INVALID_PRODUCER_EPOCH
)
"""librdkafka's texts for a producer fenced by another with its transactional id."""


@dataclass(frozen=True)
class Transient:
    facility: str
    errors: tuple[str, ...]
    why: str


TRANSIENT: tuple[Transient, ...] = (
    Transient(
        "GETPID",
        _COORDINATOR_STARTING,
        "An idempotent or transactional producer asks for its producer id; a fresh "
        "broker creates the transaction state log on that first request and loads it, "
        "and answers these until it has. librdkafka retries the request itself.",
    ),
    Transient(
        "COMMITFAIL",
        (*_COORDINATOR_STARTING, "Group rebalance in progress"),
        "An offset commit without a callback reached a group coordinator that is "
        "still loading the offsets log, or a group that is still forming. The next "
        "commit carries the same offsets or later ones.",
    ),
)


def facility_and_text(record: logging.LogRecord) -> tuple[str, str] | None:
    """The facility and text of a librdkafka line logged through `logging`."""
    return facility_and_text_of(record.args)


def facility_and_text_of(args: object) -> tuple[str, str] | None:
    """confluent-kafka logs `logger.log(level, "%s [%s] %s", facility, name, text)`."""
    if isinstance(args, tuple) and len(args) == 3 and all(isinstance(a, str) for a in args):
        return str(args[0]), str(args[2])
    return None


class GraceStreaks:
    """Tells whether a recurring condition is still within its grace period.

    A condition seen again within the grace period continues its streak; a quiet gap
    longer than the grace period starts a new one. A transient condition is young while
    its streak is shorter than the grace period, and a fault once it has lasted longer.
    """

    def __init__(self, grace_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._grace = grace_s
        self._clock = clock
        self._streaks: dict[object, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def young(self, key: object) -> bool:
        now = self._clock()
        with self._lock:
            first, last = self._streaks.get(key, (now, now))
            if now - last > self._grace:
                first = now
            self._streaks[key] = (first, now)
            return now - first <= self._grace


class StartupNoise(logging.Filter):
    """Lowers the table's transient conditions to INFO during their grace period.

    A filter runs after the logger's own level check, so a lowered line the logger
    would not have emitted at its new level is dropped here.
    """

    def __init__(self, grace_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._streaks = GraceStreaks(grace_s, clock)

    def level_for(self, facility: str, text: str, level: int) -> int:
        """The level a line of this facility and text should have."""
        if level <= logging.INFO:
            return level
        for entry in TRANSIENT:
            if entry.facility != facility:
                continue
            for error in entry.errors:
                if error in text:
                    return logging.INFO if self._streaks.young((facility, error)) else level
        return level

    def filter(self, record: logging.LogRecord) -> bool:
        parsed = facility_and_text(record)
        if parsed is None:
            return True
        level = self.level_for(*parsed, record.levelno)
        if level == record.levelno:
            return True
        if not logging.getLogger(record.name).isEnabledFor(level):
            return False
        record.levelno = level
        record.levelname = logging.getLevelName(level)
        return True


class ExpectedFences(ClientLines):
    """A `logger` for confluent-kafka that passes every line on to `logger`, the lines
    about this producer being fenced at WARNING at most: each takeover between an owner
    and its replica fences one of them, and two CRITICAL lines per takeover would page
    whoever alerts on them."""

    def _line(self, level: int, msg: str, *args: Any) -> None:
        parsed = facility_and_text_of(args) if level > logging.WARNING else None
        if parsed is not None and any(fenced in parsed[1] for fenced in FENCED_TEXTS):
            level = logging.WARNING
        self._logger.log(level, msg, *args)
