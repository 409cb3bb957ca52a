"""librdkafka's own word on the client settings, before the daemon needs it.

librdkafka checks every key and value when a client is constructed, before it connects:
an unknown key, a value out of range, a combination it refuses (`message.timeout.ms`
above `transaction.timeout.ms`). `load_settings` cannot know its whole table, so
`delayservice settings` builds one client of each kind the daemon makes, from the same
configs (`client_config`), and reports the first refusal as a setting error: a deploy
step then fails where the daemon would, instead of after the restart.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from delayservice.errors import ConfigError
from delayservice.kafka import client_config
from delayservice.settings import Settings

_QUOTED = re.compile(r'"([^"]+)"')
_QUIET = {"log_level": 0}
"""The check clients never log: built and dropped before any connection matters."""


def _roles(settings: Settings) -> list[tuple[str, dict[str, Any], Callable[..., Any]]]:
    transactional = settings.guarantee == "exactly-once"
    return [
        (
            "consumer",
            client_config.consumer(settings, "settings-check", "settings-check", "check"),
            Consumer,
        ),
        (
            "producer",
            client_config.level_producer(
                settings, "settings-check", "settings-check" if transactional else None
            ),
            Producer,
        ),
        ("kafka", client_config.admin(settings), AdminClient),
    ]


def _holder(settings: Settings, reason: str, role: str) -> str:
    """The setting whose key librdkafka named (`kafka`, `consumer` or `producer`), or
    the kind of client it refused when the key is not one a setting holds (an alias)."""
    quoted = _QUOTED.search(reason)
    key = quoted.group(1) if quoted else None
    for name in ("consumer", "producer", "kafka"):
        if key is not None and key in getattr(settings, name):
            return f"{name}.{key}"
    return f"{role} client"


def check_clients(settings: Settings) -> None:
    """Raise `ConfigError` naming the client kind and librdkafka's reason when it refuses
    to build a client the daemon would build with these settings."""
    for role, config, make in _roles(settings):
        try:
            client = make({**config, **_QUIET})
        except KafkaException as exc:
            error = exc.args[0] if exc.args else exc
            reason = (error.str() if hasattr(error, "str") else str(error)).strip()
            raise ConfigError(_holder(settings, reason, role), reason) from None
        except (TypeError, ValueError) as exc:  # confluent-kafka's own checks
            raise ConfigError(_holder(settings, str(exc), role), str(exc).strip()) from None
        close = getattr(client, "close", None)
        if close is not None:
            close()
