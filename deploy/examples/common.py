"""What the compose examples share: the same settings as the daemon, the demo topic, Ctrl-C.

The examples read the daemon's own settings (DELAYSERVICE_* variables and the TOML file
named by DELAYSERVICE_CONFIG), as `load_settings` and `DelayProducer` do by themselves,
so producer and daemon always agree on the levels.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from delayservice.kafka import client_config
from delayservice.settings import Settings
from delayservice.settings_loading import load_settings

TOPIC = os.environ.get("EXAMPLE_TOPIC", "orders.reminders")
SENT_HEADER = "example-sent-ms"

log = logging.getLogger("example")


def settings() -> Settings:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    return load_settings()


def ensure_topic(current: Settings) -> None:
    """Create the real topic the examples use; an existing one is fine."""
    admin = AdminClient(client_config.admin(current))
    topic = NewTopic(
        TOPIC, num_partitions=current.partitions, replication_factor=current.replication_factor
    )
    try:
        admin.create_topics([topic])[TOPIC].result(30)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise


def stop_event() -> threading.Event:
    """Set by SIGTERM or SIGINT, so `docker compose down` stops the example at once."""
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop
