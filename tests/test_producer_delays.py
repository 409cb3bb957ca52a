from datetime import UTC, datetime, timedelta

import pytest

from delayservice.producer import delay_to_ms


def test_delay_as_number_or_timedelta():
    assert delay_to_ms(17, None) == 17_000
    assert delay_to_ms(timedelta(minutes=2), None) == 120_000
    assert delay_to_ms(0.0001, None) == 1  # rounds up: never early


@pytest.mark.parametrize("delay", [0, -5, timedelta(seconds=-1)])
def test_no_delay_means_send_now(delay):
    assert delay_to_ms(delay, None) is None
    assert delay_to_ms(None, None) is None


def test_deliver_at_aware_datetime_or_epoch_seconds():
    at = datetime.now(UTC) + timedelta(seconds=30)
    assert 29_000 < delay_to_ms(None, at) <= 30_000
    assert 29_000 < delay_to_ms(None, at.timestamp()) <= 30_000


def test_naive_datetime_both_and_nan_are_refused():
    with pytest.raises(ValueError, match="timezone-aware"):
        delay_to_ms(None, datetime.now())
    with pytest.raises(ValueError, match="not both"):
        delay_to_ms(1, 2.0)
    with pytest.raises(ValueError, match="finite"):
        delay_to_ms(float("nan"), None)
