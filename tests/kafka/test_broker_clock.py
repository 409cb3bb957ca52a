"""The clock level due times are met by: this host's, held back by the bound on how far
it runs ahead of the broker's (`delayservice.kafka.broker_clock`)."""

from __future__ import annotations

import pytest

from delayservice.kafka.broker_clock import MAX_HOLD_BACK_S, WINDOW_S, BrokerClock
from tests.level.fakes import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_the_smallest_read_delay_holds_the_clock_back(clock):
    held = BrokerClock(clock)
    now = clock.ms()
    assert held.time() == clock.time()  # nothing read yet: nothing held
    held.observe(now, now - 2_300)  # an older record: a looser bound
    held.observe(now, now - 2_000)  # a fresh one, read as this host runs 2 s ahead
    held.observe(now, now - 2_500)
    assert held.bound_s == 2.0
    assert held.hold_back_s == 2.0
    assert held.time() == pytest.approx(clock.time() - 2.0)
    assert held.monotonic() == clock.monotonic()


def test_the_hold_back_is_capped_and_a_host_behind_is_never_moved_forward(clock):
    held = BrokerClock(clock)
    now = clock.ms()
    held.observe(now, now - 3_600_000)  # only an hour-old backlog: the bound says little
    assert held.bound_s == 3_600.0
    assert held.hold_back_s == MAX_HOLD_BACK_S
    behind = BrokerClock(clock)
    behind.observe(now, now + 1_500)  # read "before" it was appended: this host is behind
    assert behind.bound_s == -1.5
    assert behind.hold_back_s == 0.0


def test_the_bound_follows_a_clock_stepped_forward_within_two_windows(clock):
    held = BrokerClock(clock)
    now = clock.ms()
    held.observe(now, now - 10)
    assert held.hold_back_s == 0.01
    for _ in range(2):  # the host's clock now runs 1 s ahead: fresh records say so
        clock.advance(WINDOW_S)
        now = clock.ms()
        held.observe(now, now - 1_010)
    assert held.hold_back_s == 1.01


def test_a_quiet_spell_keeps_the_last_bound(clock):
    held = BrokerClock(clock)
    now = clock.ms()
    held.observe(now, now - 800)
    clock.advance(10 * WINDOW_S)  # nothing read meanwhile
    assert held.hold_back_s == 0.8
