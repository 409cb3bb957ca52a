import math
import time
import zlib
from datetime import UTC, datetime, timedelta

import pytest

from delayservice.errors import DelayTooLongError
from delayservice.producer import delay_to_ms, exact_timing, precise_partition

WEEK_MS = 7 * 86_400_000


def test_delay_as_number_or_timedelta():
    assert delay_to_ms(17, None) == 17_000
    assert delay_to_ms(timedelta(minutes=2), None) == 120_000
    assert delay_to_ms(0.0001, None) == 1  # rounds up: never early


@pytest.mark.parametrize("delay", [0, 0.0, timedelta(0), "0s", "0ms"])
def test_no_delay_means_send_now(delay):
    assert delay_to_ms(delay, None) is None
    assert delay_to_ms(None, None) is None


@pytest.mark.parametrize(
    ("delay", "ms"),
    [
        ("30s", 30_000),
        ("10m", 600_000),
        ("500ms", 500),
        (" 2h ", 7_200_000),
        ("1d", 86_400_000),
        ("30", 30_000),  # a bare number is seconds, in a string as in a number
        ("1.5", 1_500),
    ],
)
def test_a_delay_may_be_a_duration_in_the_settings_syntax(delay, ms):
    assert delay_to_ms(delay, None) == ms
    assert exact_timing(delay, None, WEEK_MS) == (ms, None)


@pytest.mark.parametrize(
    ("delay", "message"),
    [
        (-5, "must not be negative"),
        (-0.001, "must not be negative"),
        (timedelta(seconds=-1), "must not be negative"),
        (float("nan"), "finite"),
        (float("inf"), "finite"),
        (-float("inf"), "finite"),
        (10**400, "finite"),
        ("-5s", "not a duration"),
        ("-30", "must not be negative"),
        ("nan", "finite"),
        ("soon", "not a duration"),
    ],
)
def test_a_delay_that_is_no_delay_is_a_clear_value_error(delay, message):
    """A negative delay once sent at once, hiding a sign error until the message
    arrived early; a string failed with a float conversion error."""
    with pytest.raises(ValueError, match=message):
        delay_to_ms(delay, None)
    with pytest.raises(ValueError, match=message):
        exact_timing(delay, None, WEEK_MS)


@pytest.mark.parametrize("delay", [True, None.__class__, b"30s", [30]])
def test_what_is_not_a_delay_at_all_is_a_type_error(delay):
    with pytest.raises(TypeError, match="seconds, a timedelta or a duration"):
        delay_to_ms(delay, None)


@pytest.mark.parametrize("deliver_at", [float("nan"), float("inf"), 10**400])
def test_a_deliver_at_that_is_not_a_time_is_a_value_error(deliver_at):
    with pytest.raises(ValueError, match="finite"):
        delay_to_ms(None, deliver_at)


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


def test_an_exact_delay_travels_as_delay_ms_rounded_up():
    assert exact_timing(17, None, WEEK_MS) == (17_000, None)
    assert exact_timing(timedelta(seconds=1.0001), None, WEEK_MS) == (1001, None)
    assert exact_timing(WEEK_MS / 1000, None, WEEK_MS) == (WEEK_MS, None)  # the max itself


def test_an_exact_deliver_at_travels_as_an_absolute_due_time_with_no_delay():
    """The daemon takes max(append + delay-ms, delay-due-ms): delay-ms 0 keeps send
    latency from pushing an absolute time later."""
    at = time.time() + 3600.0004
    assert exact_timing(None, at, WEEK_MS) == (0, math.ceil(at * 1000))
    when = datetime.now(UTC) + timedelta(minutes=5)
    assert exact_timing(None, when, WEEK_MS) == (0, math.ceil(when.timestamp() * 1000))


@pytest.mark.parametrize(
    ("delay", "deliver_at"),
    [
        (0, None),
        ("0s", None),
        (timedelta(0), None),
        (None, None),
        (None, 1.0),
        (None, datetime.now(UTC) - timedelta(seconds=1)),
    ],
)
def test_an_exact_message_with_nothing_to_wait_for_goes_undelayed(delay, deliver_at):
    assert exact_timing(delay, deliver_at, WEEK_MS) is None


def test_an_exact_delay_above_max_delay_names_the_max():
    with pytest.raises(DelayTooLongError, match=r"above max_delay \(7d\)"):
        exact_timing((WEEK_MS + 1) / 1000, None, WEEK_MS)
    with pytest.raises(DelayTooLongError, match=r"deliver_at is .* above max_delay \(2h\)"):
        exact_timing(None, time.time() + 2 * 3600 + 5, 2 * 3_600_000)


@pytest.mark.parametrize(
    ("delay", "deliver_at", "message"),
    [
        (1, 2.0, "not both"),
        (float("nan"), None, "finite"),
        (None, float("inf"), "finite"),
        (None, datetime.now(), "timezone-aware"),
    ],
)
def test_exact_timing_refuses_what_delay_to_ms_refuses(delay, deliver_at, message):
    with pytest.raises(ValueError, match=message):
        exact_timing(delay, deliver_at, WEEK_MS)


def test_the_precise_partition_is_crc32_of_the_id_modulo_the_partitions():
    """The daemon relies on exactly this rule, so pin it to values computed by hand."""
    assert zlib.crc32(b"abc") == 891568578
    assert precise_partition("abc", 7) == 891568578 % 7
    assert precise_partition("abc", 1) == 0
    ids = [f"{n:032x}" for n in range(600)]
    assert {precise_partition(i, 3) for i in ids} == {0, 1, 2}
    assert all(precise_partition(i, 5) == zlib.crc32(i.encode()) % 5 for i in ids)


def test_the_precise_partition_needs_a_partition():
    with pytest.raises(ValueError, match="at least 1 partition"):
        precise_partition("abc", 0)


@pytest.mark.parametrize(
    ("config", "idempotent"),
    [
        ({}, True),
        ({"acks": "all"}, True),
        ({"acks": -1, "max.in.flight": 5}, True),
        ({"enable.idempotence": False}, False),
        ({"acks": 1}, None),
        ({"request.required.acks": "0"}, None),
        ({"max.in.flight.requests.per.connection": 10}, None),
        ({"retries": 0}, None),
        ({"max.in.flight": "many"}, None),
    ],
)
def test_the_producer_is_idempotent_unless_its_config_says_otherwise(config, idempotent):
    """Key order within a level needs a retried batch never to land behind a later one;
    a config that sets idempotence, or a key idempotence refuses, is left to librdkafka."""
    from delayservice.producer import with_idempotence

    assert with_idempotence(config).get("enable.idempotence") == idempotent
    assert with_idempotence(config).items() >= config.items()
