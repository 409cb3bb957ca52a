"""Log lines that would repeat once per record, at most once per interval per key.

An outage fails every forward and a hostile producer can send millions of bad
records; one warning per record would bury everything else in the log. The first line
of each key goes out at once, later ones are counted and the count rides on the next
line that goes out.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Hashable

_DIGITS = re.compile(r"\d+")


class Throttle:
    def __init__(self, every_s: float = 10.0) -> None:
        self._every = every_s
        self._last: dict[Hashable, float] = {}
        self._suppressed: dict[Hashable, int] = {}
        self._lock = threading.Lock()

    def allow(self, key: Hashable) -> int | None:
        """None to stay quiet; else how many lines of this key were held back since the
        last one (0 for the first)."""
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(key, float("-inf")) < self._every:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return None
            if len(self._last) > 1000:
                self._last.clear()
            self._last[key] = now
            return self._suppressed.pop(key, 0)


class RepeatFilter(logging.Filter):
    """Drops a log line that repeats one seen within the interval, digits aside.

    librdkafka logs every failed reconnect of every client; during an outage of a few
    seconds that is hundreds of identical lines per level. The first one of each kind
    still goes out.
    """

    def __init__(self, every_s: float = 30.0) -> None:
        super().__init__()
        self._throttle = Throttle(every_s)

    def filter(self, record: logging.LogRecord) -> bool:
        key = _DIGITS.sub("#", record.getMessage())
        return self._throttle.allow(key) is not None
