"""librdkafka configuration for every client the service creates.

The defaults here are what the invariants need (acks=all and idempotence for nothing
lost, manual commits, Java-compatible key hashing for same partitioning). User keys
from the settings are laid over them so security settings pass through, but a user
cannot switch off the ones the promises rest on.
"""

from __future__ import annotations

from typing import Any

from delayservice.settings import Settings

# Keys the promises depend on; user settings may not override these.
_PRODUCER_FIXED = {"acks": "all", "enable.idempotence": True, "partitioner": "murmur2_random"}
_CONSUMER_FIXED = {"enable.auto.commit": False, "enable.auto.offset.store": False}


def common(settings: Settings) -> dict[str, Any]:
    return {"bootstrap.servers": settings.bootstrap_servers, **settings.kafka}


def admin(settings: Settings) -> dict[str, Any]:
    return common(settings)


def producer(settings: Settings, client_id: str) -> dict[str, Any]:
    return {
        **common(settings),
        "client.id": client_id,
        "linger.ms": 5,
        "compression.type": "lz4",
        **settings.producer,
        **_PRODUCER_FIXED,
    }


def consumer(settings: Settings, group_id: str, client_id: str) -> dict[str, Any]:
    return {
        **common(settings),
        "group.id": group_id,
        "client.id": client_id,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "cooperative-sticky",
        "isolation.level": "read_committed",
        # Pre-fetch stays small: the backlog waits in Kafka, not in this process.
        "queued.max.messages.kbytes": 8192,
        "fetch.max.bytes": 8 * 1024 * 1024,
        # A resumed partition waits out the broker's long poll before its first fetch
        # returns; 100 ms instead of 500 keeps pause/resume cycles short under backpressure.
        "fetch.wait.max.ms": 100,
        **settings.consumer,
        **_CONSUMER_FIXED,
    }
