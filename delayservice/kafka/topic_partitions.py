"""How many partitions each topic a producer sends delayed messages to has, as it sees
them: the precise topics, the level topics and the markers topic.

An exact send picks its partition from the count (`ids.precise_id`), a level send from
its key over the count (`DelayProducer`), so a count known
is kept (partitions are never removed, so it stays valid) and refreshed at most every
`REFRESH_S`: producers start using partitions added to a topic within that long, and a
failed refresh changes nothing. A marker needs no count at all when its id names its
partition.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException

from delayservice.errors import BrokerUnavailableError, DelayServiceError

METADATA_TIMEOUT_S: Final = 10.0
"""How long the first delayed send or marker to a topic waits for its partition count."""
REFRESH_S: Final = 300.0
"""How often sends look for partitions a topic has gained (librdkafka's
`topic.metadata.refresh.interval.ms` default)."""
REFRESH_TIMEOUT_S: Final = 2.0

NO_ANSWER: Final = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
        KafkaError._WAIT_COORD,
    }
)
"""librdkafka's codes for a metadata request no broker answered."""


def servers_of(config: dict[str, Any]) -> str:
    """The brokers a client config names, for messages."""
    return str(config.get("bootstrap.servers") or config.get("metadata.broker.list") or "")


def metadata_failure(
    error: KafkaError, servers: str, asked: str, timeout: float
) -> DelayServiceError:
    """A metadata request that failed: an outage (`BrokerUnavailableError`, retriable,
    naming the brokers and what was asked) when no broker answered, else the error as
    librdkafka gave it. Never "create the topic": nothing was learned about it."""
    if error.code() in NO_ANSWER:
        return BrokerUnavailableError(
            f"no broker answered (bootstrap.servers {servers or 'unset'}, waited "
            f"{timeout:g} s) when asked for the partitions of {asked}: {error.str()}",
            code=error.code(),
        )
    return DelayServiceError.from_kafka(error, f"reading the partitions of {asked}")


class TopicMissingError(DelayServiceError):
    """The broker answered that the topic does not exist (a CLI exits 1, as for any
    topic it cannot use now: someone may be creating it)."""


def missing_topic(topic: str, code: int | None = None) -> TopicMissingError:
    return TopicMissingError(
        f"the broker answered that the topic {topic} does not exist; create it with "
        "`delayservice topics create` (with precise = true for precise mode's)",
        code=code,
        retriable=True,
    )


class TopicPartitions:
    def __init__(self, client: Any, servers: str = "") -> None:
        """`client`: anything with confluent-kafka's `list_topics`; `servers`: the
        brokers it was given, named when none answers."""
        self._client = client
        self._servers = servers
        self._counts: dict[str, tuple[int, float]] = {}  # topic -> (count, when read)

    def count(self, topic: str, *, refresh: bool = False) -> int:
        """The topic's partition count: read at the first need (raising a retriable
        `DelayServiceError` that names the topic when it cannot be), then with
        `refresh` again every `REFRESH_S`."""
        known = self._counts.get(topic)
        now = time.monotonic()
        if known is None:
            count = self.read(topic, METADATA_TIMEOUT_S)
        elif refresh and now - known[1] >= REFRESH_S:
            count = known[0]
            with contextlib.suppress(DelayServiceError):
                count = max(count, self.read(topic, REFRESH_TIMEOUT_S))
        else:
            return known[0]
        self._counts[topic] = (count, now)
        return count

    def missing(self, topic: str, timeout: float = METADATA_TIMEOUT_S) -> bool:
        """Whether the broker answered that the topic does not exist. A count already
        known says it does; no answer raises `BrokerUnavailableError`; a topic without a
        leader for now exists."""
        if topic in self._counts:
            return False
        try:
            self._counts[topic] = (self.read(topic, timeout), time.monotonic())
        except TopicMissingError:
            return True
        except BrokerUnavailableError:
            raise
        except DelayServiceError:
            return False
        return False

    def read(self, topic: str, timeout: float) -> int:
        """The count the broker gives now: `BrokerUnavailableError` when none answers,
        `TopicMissingError` when it says there is no such topic."""
        try:
            meta = self._client.list_topics(topic, timeout=timeout)
        except KafkaException as exc:
            raise metadata_failure(exc.args[0], self._servers, topic, timeout) from exc
        info = meta.topics.get(topic)
        error = info.error if info is not None else None
        if info is None or (error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            raise missing_topic(topic, error.code() if error is not None else None)
        if error is not None or not info.partitions:
            raise DelayServiceError(
                f"the topic {topic} cannot be written now: "
                f"{error.str() if error is not None else 'no partitions'}",
                code=error.code() if error is not None else None,
                retriable=True,
            )
        return len(info.partitions)
