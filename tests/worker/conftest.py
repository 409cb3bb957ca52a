"""Every test on the fake level rig runs under the exactly-once ownership check."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.worker import fakes


@pytest.fixture(autouse=True)
def _commits_only_what_is_owned() -> Iterator[None]:
    fakes.PRODUCERS.clear()
    yield
    violations = [v for producer in fakes.PRODUCERS for v in producer.violations]
    fakes.PRODUCERS.clear()
    assert violations == [], "a transaction committed what its member did not own"
