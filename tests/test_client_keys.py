"""The librdkafka keys the daemon owns are refused in the `kafka`, `consumer` and
`producer` settings, in every spelling librdkafka takes, with one line naming the
setting, the key, the value and why; everything else still reaches the clients."""

from __future__ import annotations

import re

import pytest
from confluent_kafka import Consumer, KafkaException, Producer

from delayservice.client_keys import CLIENT_SETTINGS, OWNED, owned
from delayservice.errors import ConfigError
from delayservice.kafka import client_config
from delayservice.settings import ENV_PREFIX
from delayservice.settings_loading import load_settings
from tests.settings_environment import only_these_settings

REFUSED = [
    # Consumers.
    ("auto.offset.reset", "latest"),
    ("auto.offset.reset", "largest"),
    ("auto.offset.reset", "end"),
    ("auto.offset.reset", "error"),
    ("isolation.level", "read_uncommitted"),
    ("enable.auto.commit", "true"),
    ("enable.auto.offset.store", "true"),
    ("group.id", "shared"),
    ("group.instance.id", "one-for-all"),
    ("partition.assignment.strategy", "range"),
    ("partition.assignment.strategy", "roundrobin"),
    ("group.protocol", "consumer"),
    ("allow.auto.create.topics", "true"),
    # Producers.
    ("acks", "1"),
    ("acks", "0"),
    ("enable.idempotence", "false"),
    ("max.in.flight.requests.per.connection", "6"),
    ("queuing.strategy", "lifo"),
    ("partitioner", "consistent_random"),
    ("transactional.id", "mine"),
    ("transaction.timeout.ms", "60000"),
    ("delivery.report.only.error", "true"),
    # Callbacks only code can give.
    ("error_cb", "print"),
    ("throttle_cb", "print"),
    ("stats_cb", "print"),
    ("oauth_cb", "print"),
    ("on_delivery", "print"),
    ("on_commit", "print"),
    ("logger", "root"),
    ("dr_cb", "print"),
    ("dr_msg_cb", "print"),
]
ALIASES = [
    ("request.required.acks", "1", "acks"),
    ("topic.acks", "1", "acks"),
    ("topic.request.required.acks", "1", "acks"),
    ("max.in.flight", "6", "max.in.flight.requests.per.connection"),
    ("auto.commit.enable", "true", "enable.auto.commit"),
    ("topic.auto.commit.enable", "true", "enable.auto.commit"),
    ("topic.enable.auto.commit", "true", "enable.auto.commit"),
    ("topic.auto.offset.reset", "latest", "auto.offset.reset"),
    ("topic.partitioner", "random", "partitioner"),
]
# librdkafka reads values without regard to case or surrounding spaces, and takes
# t/1 for true: each of these means what the refused value means.
SPELLED_OTHERWISE = [
    ("auto.offset.reset", "LATEST"),
    ("auto.offset.reset", " latest"),
    ("isolation.level", "READ_UNCOMMITTED"),
    ("enable.auto.commit", "TRUE"),
    ("enable.auto.commit", "t"),
    ("enable.auto.commit", "1"),
    ("enable.idempotence", "0"),
    ("acks", " 1 "),
]
# Values that mean what the daemon sets anyway.
SAME_AS_THE_DAEMON = [
    ("auto.offset.reset", "earliest"),
    ("auto.offset.reset", "smallest"),
    ("topic.auto.offset.reset", "beginning"),
    ("isolation.level", "read_committed"),
    ("enable.auto.commit", "false"),
    ("auto.commit.enable", "0"),
    ("enable.auto.offset.store", "False"),
    ("partition.assignment.strategy", "cooperative-sticky"),
    ("group.protocol", "classic"),
    ("allow.auto.create.topics", "false"),
    ("acks", "all"),
    ("acks", "-1"),
    ("request.required.acks", "ALL"),
    ("enable.idempotence", "true"),
    ("max.in.flight", "5"),
    ("max.in.flight.requests.per.connection", "1"),
    ("queuing.strategy", "fifo"),
    ("partitioner", "murmur2_random"),
]
HARMLESS = {
    "kafka": {"security.protocol": "PLAINTEXT", "retry.backoff.ms": "50"},
    "consumer": {
        "client.id": "ops",
        "fetch.max.bytes": "1048576",
        "enable.partition.eof": "true",
        "session.timeout.ms": "30000",
        "check.crcs": "true",
    },
    "producer": {
        "linger.ms": "5",
        "queue.buffering.max.ms": "5",
        "compression.type": "zstd",
        "retries": "3",
        "message.timeout.ms": "60000",
    },
}
ONE_LINE = re.compile(r"invalid setting (kafka|consumer|producer): [^\n]+")


def refused(setting: str, key: str, value: object) -> str:
    with pytest.raises(ConfigError) as caught:
        load_settings(**{setting: {key: value}})
    message = str(caught.value)
    assert ONE_LINE.fullmatch(message), message
    assert message.startswith(f"invalid setting {setting}: "), message
    return message


@pytest.mark.parametrize("setting", CLIENT_SETTINGS)
@pytest.mark.parametrize(("key", "value"), REFUSED, ids=str)
def test_a_key_the_daemon_owns_is_refused_with_one_line(setting, key, value):
    message = refused(setting, key, value)
    assert f"{key} = {value!r} " in message
    assert "the daemon owns this key: remove it" in message
    assert owned(key) is not None
    assert owned(key).why in message  # type: ignore[union-attr]


@pytest.mark.parametrize("setting", CLIENT_SETTINGS)
@pytest.mark.parametrize(("alias", "value", "name"), ALIASES, ids=str)
def test_every_spelling_librdkafka_takes_is_refused_and_named(setting, alias, value, name):
    assert f"{alias} ({name}) = {value!r} " in refused(setting, alias, value)


@pytest.mark.parametrize(("key", "value"), SPELLED_OTHERWISE, ids=str)
def test_a_refused_value_in_any_case_or_spacing_is_refused(key, value):
    assert f"{key} = {value!r} " in refused("consumer", key, value)


@pytest.mark.parametrize("setting", CLIENT_SETTINGS)
def test_a_nested_topic_config_is_refused_naming_the_owned_key_inside(setting):
    nested = {"message.timeout.ms": "60000", "auto.offset.reset": "latest"}
    message = refused(setting, "default.topic.config", nested)
    assert "default.topic.config: auto.offset.reset = 'latest' would skip" in message


def test_a_nested_topic_config_of_harmless_keys_is_refused_as_nested():
    message = refused("producer", "default.topic.config", {"message.timeout.ms": "60000"})
    assert "default.topic.config = {'message.timeout.ms': '60000'} nests topic keys" in message
    # As a string it reached confluent-kafka, which raised AttributeError: a traceback.
    assert "nests topic keys" in refused("producer", "default.topic.config", "acks=1")


def test_the_environment_and_the_file_are_refused_alike(tmp_path):
    variable = f"{ENV_PREFIX}CONSUMER"
    nested = '{"default.topic.config": {"topic.auto.offset.reset": "latest"}}'
    for text in ('{"isolation.level": "read_uncommitted"}', nested):
        with only_these_settings({variable: text}), pytest.raises(ConfigError) as caught:
            load_settings()
        assert str(caught.value).startswith("invalid setting consumer: "), caught.value
    path = tmp_path / "delayservice.toml"
    path.write_text('[producer]\n"request.required.acks" = "1"\n')
    with only_these_settings({}), pytest.raises(ConfigError, match=r"producer: request\.req"):
        load_settings(path)


@pytest.mark.parametrize("setting", CLIENT_SETTINGS)
@pytest.mark.parametrize(("key", "value"), SAME_AS_THE_DAEMON, ids=str)
def test_a_value_that_means_what_the_daemon_sets_is_taken(setting, key, value):
    assert getattr(load_settings(**{setting: {key: value}}), setting) == {key: value}


def test_harmless_overrides_still_reach_the_clients():
    settings = load_settings(**HARMLESS)  # type: ignore[arg-type]
    consumer = client_config.consumer(settings, "g", "c", "member")
    producer = client_config.level_producer(settings, "p")  # at least once
    for key, value in {**HARMLESS["kafka"], **HARMLESS["consumer"]}.items():
        assert consumer[key] == value, key
    for key, value in {**HARMLESS["kafka"], **HARMLESS["producer"]}.items():
        assert producer[key] == value, key


def _daemon_sets() -> dict[str, object]:
    """Every key the daemon's clients set themselves that a setting could also set."""
    settings = load_settings()
    consumer = client_config.consumer(settings, "g", "c", "member")
    exactly_once = client_config.level_producer(settings, "p", "txn")
    return {**consumer, **exactly_once}


def test_every_key_the_daemon_forces_over_the_settings_is_owned():
    """client_config sets these after the user's keys: a user value would be dropped
    without a word. Each is refused instead, and the daemon's own value is one that
    the table takes, so the two cannot drift apart."""
    forced = {
        **client_config._PRODUCER_FIXED,
        **client_config._CONSUMER_FIXED,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    }
    sets = _daemon_sets()
    for key, value in forced.items():
        entry = owned(key)
        assert entry is not None, key
        assert sets[key] == value, key
        assert str(value).lower() in entry.allowed, key
    for key in ("group.id", "group.instance.id", "transactional.id", "transaction.timeout.ms"):
        assert key in sets, key
        assert owned(key) is not None, key
    assert owned("delivery.report.only.error") is not None


NOT_LIBRDKAFKA = {"error_cb", "throttle_cb", "stats_cb", "oauth_cb", "on_delivery", "on_commit"}
NOT_LIBRDKAFKA |= {"logger", "dr_cb", "dr_msg_cb", "delivery.report.only.error"}


@pytest.mark.parametrize(
    "name",
    sorted(
        {n for key in OWNED for n in (key.name, *key.aliases)} - NOT_LIBRDKAFKA
        | {alias for alias, _, _ in ALIASES}
    ),
)
def test_each_refused_spelling_is_one_librdkafka_takes(name):
    """The table names real librdkafka keys: a nonsense value is refused for its value,
    never as an unknown key (which would mean the alias list drifted)."""
    for client, base in ((Consumer, {"group.id": "g"}), (Producer, {})):
        refused = _refused_by(client, {"bootstrap.servers": "127.0.0.1:1", **base, name: "@@"})
        if refused is None:  # names and ids take any value
            assert name in {"group.id", "group.instance.id", "transactional.id"}, name
        else:
            assert "No such configuration property" not in refused, refused


def _refused_by(client: type[Consumer] | type[Producer], config: dict[str, str]) -> str | None:
    try:
        made = client(config)
    except KafkaException as exc:
        return str(exc.args[0].str())
    if isinstance(made, Consumer):
        made.close()
    return None
