"""librdkafka configuration for every client the service creates.

The defaults here are what the invariants need (acks=all and idempotence for nothing
lost, manual commits, Java-compatible key hashing for same partitioning). User keys
from the settings are laid over them so security settings pass through. The keys the
promises rest on are refused in the settings (`delayservice.client_keys`, which a test
holds to what is set here) and are still set last here.
"""

from __future__ import annotations

import logging
from typing import Any

from delayservice.kafka.client_lines import ClientLines
from delayservice.kafka.log_levels import StartupNoise
from delayservice.log_throttle import RepeatFilter
from delayservice.settings import Settings

# Keys the promises depend on; the settings refuse other values (client_keys).
_PRODUCER_FIXED = {
    "acks": "all",
    "enable.idempotence": True,
    "partitioner": "murmur2_random",
    # A typo in a target name must be dead-lettered, not create a topic.
    "allow.auto.create.topics": False,
}
_CONSUMER_FIXED = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "allow.auto.create.topics": False,
    # The revoke hand-over and the explicit start offsets on assignment are built on
    # incremental (cooperative) rebalancing.
    "partition.assignment.strategy": "cooperative-sticky",
}

LIBRDKAFKA_LOGGER = "delayservice.librdkafka"
METADATA_REFRESH_MS = 5_000
"""How soon the daemon's consumers see partitions added to the topics they read."""


def librdkafka_logger() -> logging.Logger:
    """The logger librdkafka's lines go to, with a fresh broker's start-up lowered to
    INFO and repeats (reconnect storms) dropped."""
    logger = logging.getLogger(LIBRDKAFKA_LOGGER)
    if not any(isinstance(f, StartupNoise) for f in logger.filters):
        logger.addFilter(StartupNoise())
    if not any(isinstance(f, RepeatFilter) for f in logger.filters):
        logger.addFilter(RepeatFilter())
    return logger


def common(settings: Settings) -> dict[str, Any]:
    """Every client's base; librdkafka's own log lines go through Python logging
    (forwarded when the client is polled) so operators read one stream, and never
    raise into the client (`ClientLines`)."""
    return {
        "bootstrap.servers": settings.bootstrap_servers,
        **settings.kafka,
        "logger": ClientLines(librdkafka_logger()),
    }


def admin(settings: Settings) -> dict[str, Any]:
    return common(settings)


def producer(
    settings: Settings, client_id: str, defaults: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`defaults` replace the ones below; the user's `producer` keys still win."""
    return {
        **common(settings),
        "client.id": client_id,
        # A forward is due now: waiting to fill a batch adds to its lateness (a bare
        # producer here: p50 append delay 1.2 ms at 1 ms, 5.4 ms at 5 ms). It costs
        # about a tenth of catch-up throughput; under a backlog batches fill anyway.
        "linger.ms": 1,
        "compression.type": "lz4",
        # Records in this queue are copies of buffered ones; keep the copy bounded.
        "queue.buffering.max.kbytes": 65536,
        # A record librdkafka cannot deliver comes back within 30 s (not its default
        # 5 min) and goes through the forwarder's own retry and give-up rules; seen
        # with a target deleted and re-created under an idempotent producer.
        "message.timeout.ms": 30_000,
        **(defaults or {}),
        **settings.producer,
        **_PRODUCER_FIXED,
    }


LEVEL_PRODUCER_DEFAULTS = {
    # Measured forwarding a backlog (benchmarks/forwarding.py, broker on the same two
    # cores): lz4 held the daemon to about a third of a bare pipe, no compression to
    # about half. Compression is the user's choice (`producer = {"compression.type" =
    # ...}`). Linger: 1 ms and 5 ms forwarded a 1,000,000 backlog at the same ratio
    # (0.45 and 0.46-0.47 of the pipe), while steady 10,000 msg/s was late p50 4 / p99
    # 24 ms at 1 ms against 8 / 34 ms at 5 (benchmarks/steady_lateness.py).
    "compression.type": "none",
    "linger.ms": 1,
}


TRANSACTION_TIMEOUT_MS = 10_000
"""A transaction left open by a dead instance pins read_committed readers at the last
stable offset until the broker aborts it: keep that short. librdkafka requires
`message.timeout.ms` to be at most this."""


def level_producer(
    settings: Settings, client_id: str, transactional_id: str | None = None
) -> dict[str, Any]:
    """A level's forwarding producer: only failures come back as delivery reports (the
    forwarder commits after a flush or a transaction, not per record). With a
    `transactional_id` it forwards exactly once: the id is stable per instance and
    level, so a restarted instance fences its predecessor's open transaction."""
    config = producer(settings, client_id, LEVEL_PRODUCER_DEFAULTS)
    config["delivery.report.only.error"] = True
    if transactional_id is not None:
        config.update(
            {
                "transactional.id": transactional_id,
                "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                "message.timeout.ms": min(
                    int(config["message.timeout.ms"]), TRANSACTION_TIMEOUT_MS
                ),
                # After a commit the coordinator may answer CONCURRENT_TRANSACTIONS to the
                # next AddOffsetsToTxn; librdkafka retries after this backoff (100 ms by
                # default, which stalled back-to-back transactions by about 100 ms).
                "retry.backoff.ms": 10,
            }
        )
    return config


def consumer(
    settings: Settings, group_id: str, client_id: str, instance_id: str | None = None
) -> dict[str, Any]:
    """`instance_id` turns on static membership: a restarted process with the same id
    takes its partitions back at once instead of waiting out the dead one's session."""
    static = {"group.instance.id": instance_id} if instance_id else {}
    return {
        **common(settings),
        "group.id": group_id,
        "client.id": client_id,
        "session.timeout.ms": int(settings.session_timeout_s * 1000),
        **static,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        # Pre-fetch stays small: the backlog waits in Kafka, not in this process.
        "queued.max.messages.kbytes": 8192,
        "fetch.max.bytes": 8 * 1024 * 1024,
        # A resumed partition waits out the broker's long poll before its first fetch
        # returns, and pausing throws away what was fetched: under a backlog each
        # pause/resume cycle starved the forwarder for that long. 20 ms instead of
        # librdkafka's 500 (and of 100: forwarding at a third of the bare pipe).
        "fetch.wait.max.ms": 20,
        # Once the pre-fetch bound is reached librdkafka waits this long before it
        # fetches that partition again (1 s by default): under a backlog the forwarder
        # drained the buffer and then sat idle for most of that second.
        "fetch.queue.backoff.ms": 10,
        # Partitions added to a level topic are assigned once the group's leader sees
        # them in its metadata: at librdkafka's default (5 min) a message sent to one
        # waited that long, whatever its delay.
        "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
        **settings.consumer,
        **_CONSUMER_FIXED,
    }
