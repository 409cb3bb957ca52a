"""What the level and forward tests share: a fake clock for the modules that read time, and the
exactly-once ownership check that every test on the fake level rig runs under."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from delayservice.forward import dead_letter as dead_letter_module
from delayservice.forward import fast_path as interpreted_fast_path
from delayservice.forward import speedups
from delayservice.level import consumer_loop as consumer_loop_module
from tests.level import fakes
from tests.level.fakes import FakeClock


@pytest.fixture(autouse=True)
def _commits_only_what_is_owned() -> Iterator[None]:
    fakes.PRODUCERS.clear()
    yield
    violations = [v for producer in fakes.PRODUCERS for v in producer.violations]
    fakes.PRODUCERS.clear()
    assert violations == [], "a transaction committed what its member did not own"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    clock = FakeClock()
    for module in (dead_letter_module, consumer_loop_module):
        monkeypatch.setattr(module, "time", clock)
    return clock


@pytest.fixture(autouse=True, params=["interpreted", "compiled"])
def fast_path_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs on both fast paths: the module as written, and the one
    setup.py compiles from it (required under CI, where the build must not fail)."""
    if request.param == "interpreted":
        module = interpreted_fast_path
    else:
        compiled = speedups.compiled_fast_path()
        if compiled is None:
            if os.environ.get("CI"):
                pytest.fail("the compiled fast path was not built (or is stale)")
            pytest.skip("the compiled fast path is not built here")
        module = compiled
    monkeypatch.setattr(speedups, "fast_path", lambda: module)
    return str(request.param)
