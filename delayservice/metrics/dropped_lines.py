"""`delayservice_librdkafka_lines_dropped_total`: librdkafka log lines that logging could
not take (`kafka.client_lines`).

The clients are made where no registry reaches (`kafka.client_config` builds their
configuration from the settings alone), and a line belongs to the process whichever
client logged it, so the count is the process's, read at each scrape.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector


class DroppedLines(Collector):
    total: ClassVar[int] = 0
    """Lines dropped by every client of the process; approximate, as the logging path
    takes no lock."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "delayservice_librdkafka_lines_dropped",
            "librdkafka log lines dropped because logging them raised (a failing filter or "
            "handler); the first of each client is also printed on stderr",
            value=DroppedLines.total,
        )
