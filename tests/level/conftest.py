"""What the level and forward tests share: a fake clock for the modules that read time, and the
exactly-once ownership check that every test on the fake level rig runs under."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from delayservice.forward import fast_path as interpreted_fast_path
from delayservice.forward import speedups
from tests.ci import IN_CI
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
    for module in fakes.CLOCKED_MODULES:
        monkeypatch.setattr(module, "time", clock)
    return clock


IMPLEMENTATIONS = ["interpreted", "compiled"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each test here on fakes runs on both fast paths; a test on the real broker runs on
    the one the daemon picks (compiled under CI), once: the suite's time goes to faults."""
    if "fast_path_impl" in metafunc.fixturenames and not metafunc.definition.get_closest_marker(
        "kafka"
    ):
        metafunc.parametrize("fast_path_impl", IMPLEMENTATIONS, indirect=True)


@pytest.fixture(autouse=True)
def fast_path_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The fast path a test runs on: the module as written, or the one setup.py compiles
    from it (required under CI, where the build must not fail)."""
    chosen = getattr(request, "param", None)
    if chosen is None:
        if IN_CI:
            assert speedups.compiled_fast_path() is not None, "the compiled fast path is missing"
        return "default"
    if chosen == "interpreted":
        module = interpreted_fast_path
    else:
        compiled = speedups.compiled_fast_path()
        if compiled is None:
            if IN_CI:
                pytest.fail("the compiled fast path was not built (or is stale)")
            pytest.skip("the compiled fast path is not built here")
        module = compiled
    monkeypatch.setattr(speedups, "fast_path", lambda: module)
    return str(chosen)
