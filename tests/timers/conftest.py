"""Fixtures for the timer tests: a clock the test moves by hand, and a bounded wait."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

import pytest


class SimClock:
    """Seconds that pass only when a test says so, so timer tests never sleep."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


class SimClockMs:
    """Integer milliseconds for the Kafka-style timers, moved by hand."""

    def __init__(self, start: int = 1_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now


class InlineExecutor(Executor):
    """Runs each task at submit, on the caller's thread: deterministic expiry for tests."""

    def __init__(self) -> None:
        self.shut = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if self.shut:
            raise RuntimeError("cannot schedule new futures after shutdown")
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.shut = True


def _wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll `condition` until it holds or `timeout` passes; never a fixed sleep."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


# Session-scoped factories rather than instances: hypothesis runs many examples per
# test function and each example needs a fresh clock.
@pytest.fixture(scope="session")
def new_sim_clock() -> Callable[[], SimClock]:
    return SimClock


@pytest.fixture(scope="session")
def new_sim_clock_ms() -> Callable[[], SimClockMs]:
    return SimClockMs


@pytest.fixture(scope="session")
def new_inline_executor() -> Callable[[], InlineExecutor]:
    return InlineExecutor


@pytest.fixture(scope="session")
def wait_until() -> Callable[..., bool]:
    return _wait_until
