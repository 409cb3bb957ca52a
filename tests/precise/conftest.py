"""Fixtures the exactly-once rigs share: one fake clock and one fake transaction
coordinator per test."""

from __future__ import annotations

import pytest

from tests.level.fakes import FakeClock
from tests.precise.txn_fakes import FakeCoordinator


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def coordinator() -> FakeCoordinator:
    return FakeCoordinator()
