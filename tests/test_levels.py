import pytest

from delayservice.errors import ConfigError, DelayTooLongError
from delayservice.levels import DEFAULT_LEVELS, LevelSet, format_duration_ms, parse_duration_ms


def test_default_levels_are_the_source_materials_twelve():
    levels = LevelSet.parse(DEFAULT_LEVELS)
    assert [lv.name for lv in levels] == [
        "5s",
        "10s",
        "30s",
        "1m",
        "2m",
        "5m",
        "10m",
        "20m",
        "30m",
        "45m",
        "1h",
        "2h",
    ]
    assert [lv.topic for lv in levels] == [f"delay_topic_{i}" for i in range(1, 13)]


@pytest.mark.parametrize(
    ("delay_ms", "expected"),
    [
        (1, "5s"),
        (5000, "5s"),
        (5001, "10s"),
        (17_000, "30s"),
        (3_600_000, "1h"),
        (3_600_001, "2h"),
        (7_200_000, "2h"),
    ],
)
def test_a_delay_goes_to_the_smallest_level_at_least_as_long(delay_ms, expected):
    assert LevelSet.parse(DEFAULT_LEVELS).select(delay_ms).name == expected


def test_a_delay_above_the_top_level_is_refused_with_the_reason():
    with pytest.raises(DelayTooLongError, match="above the top level"):
        LevelSet.parse("1s,2s").select(2001)


@pytest.mark.parametrize("text", ["", "5s,5s", "10s,5s", "0s", "5x", "5", "1s,,abc"])
def test_bad_level_strings_name_the_setting(text):
    with pytest.raises(ConfigError, match="levels"):
        LevelSet.parse(text)


def test_prefix_and_lookup_by_topic():
    levels = LevelSet.parse("500ms,1s", topic_prefix="dq_")
    assert levels.by_topic("dq_2").delay_ms == 1000
    assert levels.by_topic("delay_topic_1") is None
    assert levels.spec() == "500ms,1s"


@pytest.mark.parametrize("text", ["250ms", "5s", "90s", "2m", "3h", "1d"])
def test_durations_round_trip(text):
    assert parse_duration_ms(format_duration_ms(parse_duration_ms(text))) == parse_duration_ms(text)
