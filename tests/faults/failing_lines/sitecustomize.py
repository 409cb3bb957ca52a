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

from failing_filter import FailingFilter, install, rearm  # beside this file

PREFIX = os.environ.get("DELAYSERVICE_TEST_FAIL_LINES", "")
START_S = float(os.environ.get("DELAYSERVICE_TEST_FAIL_AFTER_S", "3"))


def _arm(failing: FailingFilter, stop: threading.Event) -> None:
    if stop.wait(START_S):
        return
    from delayservice.kafka.client_config import LIBRDKAFKA_LOGGER
    from delayservice.kafka.client_lines import ClientLines

    # The guard that keeps a failing line out of the client's call, taken away: the line
    # stands for any callback that fails inside consume().
    ClientLines.log = ClientLines._line  # type: ignore[method-assign]
    install(logging.getLogger(LIBRDKAFKA_LOGGER), failing)
    rearm(failing, stop)


if PREFIX:
    threading.Thread(
        target=_arm,
        args=(FailingFilter(PREFIX), threading.Event()),
        name="failing-lines",
        daemon=True,
    ).start()
