"""A logging filter that fails librdkafka's next log line on some threads, as a broken
filter would: such a line is served inside the client call that polled for it, and a
`consume()` then drops the batch it fetched. Shared by the in-process rows
(`tests/kafka/test_consume_callback_failure.py`) and the daemon subprocess's
`sitecustomize` beside this file, which must import it without the `tests` package."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

REARM_S = 0.7
"""How often a line is made to fail: longer than the consumer thread's pause after a
failed turn, or every consume() fails and nothing is ever assigned (a filter failing
all the time fails the assignment's offset fetches too)."""


class FailingFilter(logging.Filter):
    """While `armed`, fails the next line logged on a thread named `thread_prefix`."""

    def __init__(self, thread_prefix: str) -> None:
        super().__init__()
        self.thread_prefix = thread_prefix
        self.armed = threading.Event()
        self.raised = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if self.armed.is_set() and threading.current_thread().name.startswith(self.thread_prefix):
            self.armed.clear()
            self.raised += 1
            raise RuntimeError("a logging filter failed")
        return True


def install(logger: logging.Logger, failing: FailingFilter) -> Callable[[], None]:
    """Puts `failing` first on `logger` at DEBUG (the client's `debug` lines reach it),
    kept out of the log it would reach; returns what puts the logger back."""
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.filters.insert(0, failing)  # before the daemon's, which drop repeated lines

    def restore() -> None:
        failing.armed.clear()
        logger.removeFilter(failing)
        logger.setLevel(level)
        logger.propagate = propagate

    return restore


def rearm(failing: FailingFilter, stop: threading.Event) -> None:
    """Arms `failing` every `REARM_S` until `stop`, each time waiting for a line to take it."""
    while not stop.wait(REARM_S):
        failing.armed.set()
        while failing.armed.is_set() and not stop.wait(0.01):
            pass  # until a line took it
