"""Secret librdkafka keys never show in repr, str, errors or the daemon's log."""

from __future__ import annotations

import logging

import pytest

from delayservice.errors import ConfigError
from delayservice.redaction import REDACTED, is_secret, redacted
from delayservice.settings_loading import load_settings

SECRET = "hunter2-do-not-print"


@pytest.mark.parametrize(
    "key",
    [
        "sasl.password",
        "ssl.key.password",
        "ssl.keystore.password",
        "sasl.oauthbearer.client.secret",
    ],
)
def test_secret_keys_are_recognised(key):
    assert is_secret(key)
    assert redacted({key: SECRET}) == {key: REDACTED}


def test_plain_keys_are_kept():
    assert redacted({"security.protocol": "SASL_SSL"}) == {"security.protocol": "SASL_SSL"}


def test_repr_and_str_of_settings_hide_secrets_but_keep_them_usable():
    settings = load_settings(kafka={"sasl.password": SECRET}, producer={"ssl.key.password": SECRET})
    assert SECRET not in repr(settings)
    assert SECRET not in str(settings)
    assert REDACTED in repr(settings)
    assert settings.kafka["sasl.password"] == SECRET


def test_a_bad_secret_value_is_reported_without_the_value(tmp_path):
    config = tmp_path / "d.toml"
    config.write_text(f'[kafka]\n"sasl.password" = ["{SECRET}"]\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    assert SECRET not in str(caught.value)


@pytest.mark.kafka
def test_a_running_daemon_never_logs_a_secret(testbed, caplog):
    caplog.set_level(logging.DEBUG)
    settings = testbed.settings(levels="1s", kafka={"sasl.password": SECRET, "sasl.username": "u"})
    testbed.create_delay_topics(settings)
    daemon = testbed.start_daemon(settings)
    testbed.wait_for(lambda: daemon.readiness()[0], 60, "the daemon to be ready")
    daemon.stop()
    assert caplog.records, "the daemon logged nothing, so this test would prove nothing"
    assert all(SECRET not in record.getMessage() for record in caplog.records)
