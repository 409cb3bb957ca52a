import pytest

from delayservice.errors import ConfigError
from delayservice.settings import load_settings


def test_defaults_are_valid():
    settings = load_settings()
    assert settings.level_set().spec().startswith("5s,10s")
    assert settings.scheduler == "heap"


def test_environment_beats_the_file_and_arguments_beat_both(tmp_path, monkeypatch):
    config = tmp_path / "d.toml"
    config.write_text(
        'levels = "1s,2s"\ngroup_id = "from-file"\npartitions = 5\n'
        '[kafka]\n"security.protocol" = "PLAINTEXT"\n'
    )
    monkeypatch.setenv("DELAYSERVICE_GROUP_ID", "from-env")
    settings = load_settings(config, partitions=7)
    assert settings.levels == "1s,2s"
    assert settings.group_id == "from-env"
    assert settings.partitions == 7
    assert settings.kafka == {"security.protocol": "PLAINTEXT"}


def test_a_misspelt_environment_variable_is_an_error(monkeypatch):
    monkeypatch.setenv("DELAYSERVICE_LEVLES", "1s")
    with pytest.raises(ConfigError, match="DELAYSERVICE_LEVLES"):
        load_settings()


def test_an_unknown_key_in_the_file_is_an_error(tmp_path):
    config = tmp_path / "d.toml"
    config.write_text("pause_hihg_water = 5\n")
    with pytest.raises(ConfigError, match="pause_hihg_water: unknown setting"):
        load_settings(config)


@pytest.mark.parametrize(
    ("overrides", "setting"),
    [
        ({"levels": "1s,x"}, "levels"),
        ({"pause_low_water": 10, "pause_high_water": 10}, "pause_low_water"),
        ({"metrics_port": 70000}, "metrics_port"),
        ({"scheduler": "tree"}, "scheduler"),
    ],
)
def test_bad_values_name_the_setting(overrides, setting):
    with pytest.raises(ConfigError, match=setting):
        load_settings(**overrides)


def test_broken_toml_and_missing_file(tmp_path):
    broken = tmp_path / "b.toml"
    broken.write_text("levels = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(broken)
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")


def test_the_shipped_example_config_loads():
    from pathlib import Path

    example = Path(__file__).parent.parent / "config" / "delayservice.toml"
    settings = load_settings(example)
    assert settings.level_set().max_delay_ms == 7_200_000


def test_command_variables_are_not_mistaken_for_settings(monkeypatch):
    for name in ("DELAYSERVICE_CHECK_URL", "DELAYSERVICE_AUDIT_GRACE", "DELAYSERVICE_CONFIG"):
        monkeypatch.setenv(name, "x")
    monkeypatch.delenv("DELAYSERVICE_CONFIG")
    assert load_settings().group_id == "delayservice"
