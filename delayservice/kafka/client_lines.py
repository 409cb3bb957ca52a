"""The `logger` every client of the daemon is given: librdkafka's lines, passed on to
Python logging, never raising back into the client.

confluent-kafka serves those lines inside the call that polls the client. A line whose
logging raised there (a filter or handler that fails, on some odd text from a broker)
made `consume()` drop the batch it had fetched after the client had moved past it, and
left librdkafka unable to destroy the client: its `close()` never returned
(docs/faults.md, row 33). Here such a line is dropped and counted instead, and the
first one is told on stderr, which needs no logging to work; every one is counted for
Prometheus (`metrics.dropped_lines`), for an alert that the once-per-client line is not.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any

from delayservice.kafka.client_errors import raised_by, told
from delayservice.metrics.dropped_lines import DroppedLines


class ClientLines:
    """Passes each line on to `logger`; a subclass changes what passing on means
    (`_line`), and never has to guard it."""

    def __init__(self, logger: Any) -> None:
        self._logger = logger
        self.dropped = 0
        """Lines whose logging raised (an approximate count: no lock on this path)."""

    def log(self, level: int, msg: str, *args: Any) -> None:
        """confluent-kafka calls `log(level, "%s [%s] %s", facility, client, text)`."""
        raised = raised_by(functools.partial(self._line, level, msg, *args))
        if raised is not None:  # never into the client's call
            self.dropped += 1
            DroppedLines.total += 1
            if self.dropped == 1:
                with contextlib.suppress(Exception):  # stderr closed: nothing to tell
                    print(
                        f"delayservice: a librdkafka log line could not be logged ({told(raised)});"
                        " such lines are dropped",
                        file=sys.stderr,
                        flush=True,
                    )

    def _line(self, level: int, msg: str, *args: Any) -> None:
        self._logger.log(level, msg, *args)
