"""Loaded by a daemon subprocess whose `PYTHONPATH` starts with this directory: once
`DELAYSERVICE_TEST_FAIL_LINES` names a thread prefix, librdkafka's log lines on threads
so named fail now and then, as a broken logging filter would, with `ClientLines`'
guard taken away. Such a line is served inside `consume()`, which then drops the batch
it fetched (`tests/kafka/test_consume_callback_failure.py`); here the daemon may be
killed at any moment after.

Test support only: the package never imports it."""

from __future__ import annotations

import logging
import os
import threading

PREFIX = os.environ.get("DELAYSERVICE_TEST_FAIL_LINES", "")
START_S = float(os.environ.get("DELAYSERVICE_TEST_FAIL_AFTER_S", "3"))
REARM_S = 0.7
"""Longer than the pause after a failed turn, or every consume() fails (see
`tests/kafka/test_consume_callback_failure.py`, `REARM_S`)."""


class _FailingFilter(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.armed = threading.Event()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.armed.is_set() and threading.current_thread().name.startswith(PREFIX):
            self.armed.clear()
            raise RuntimeError("a logging filter failed")
        return True


def _arm(failing: _FailingFilter, stop: threading.Event) -> None:
    if stop.wait(START_S):
        return
    from delayservice.kafka.client_lines import ClientLines

    # The guard that keeps a failing line out of the client's call, taken away: the line
    # stands for any callback that fails inside consume().
    ClientLines.log = ClientLines._line  # type: ignore[method-assign]
    logger = logging.getLogger("delayservice.librdkafka")
    logger.setLevel(logging.DEBUG)  # the client's `debug` lines reach the filter
    logger.propagate = False  # and never the daemon's log
    logger.filters.insert(0, failing)  # before the daemon's, which drop repeated lines
    while not stop.wait(REARM_S):
        failing.armed.set()
        while failing.armed.is_set() and not stop.wait(0.01):
            pass  # until a line took it


if PREFIX:
    threading.Thread(
        target=_arm, args=(_FailingFilter(), threading.Event()), name="failing-lines", daemon=True
    ).start()
