"""How many partitions each topic a producer sends delayed messages to has, as it sees
them: the precise topics, the level topics and the markers topic.

An exact send picks its partition from the count (`ids.precise_id`), a level send from
its key over the count (`DelayProducer`), so a count known
is kept (partitions are never removed, so it stays valid) and refreshed at most every
`REFRESH_S`: producers start using partitions added to a topic within that long, and a
failed refresh changes nothing. A marker needs no count at all when its id names its
partition.

`produce()` never waits for the broker (`known`): counts are read ahead, on a thread of
their own, from when the producer is made (`read_ahead`) and whenever a send finds a
count unknown or due for a refresh; each answer goes to `on_read`, and a topic that
`still_needed` says sends wait for is asked again every `RETRY_S`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException

from delayservice.errors import BrokerUnavailableError, DelayServiceError

METADATA_TIMEOUT_S: Final = 10.0
"""How long a marker that needs a topic's count (an id naming no partition) waits for it."""
READ_AHEAD_TIMEOUT_S: Final = 1.0
"""How long one read ahead waits (then it is tried again): short, because librdkafka's
`close()` waits for a metadata request in flight."""
REFRESH_S: Final = 300.0
"""How often sends look for partitions a topic has gained (librdkafka's
`topic.metadata.refresh.interval.ms` default)."""
RETRY_S: Final = 1.0
"""How soon a count that sends wait for is asked again after no broker answered."""

OnRead = Callable[[str, "int | None", "DelayServiceError | None"], None]
"""Told each answer read ahead: the topic, its count or why there is none."""


def spawn(target: Callable[[], None]) -> None:
    """Runs the read-ahead (tests replace it to run in line)."""
    threading.Thread(target=target, name="delayservice-metadata", daemon=True).start()


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
    def __init__(
        self,
        client: Any,
        servers: str = "",
        on_read: OnRead | None = None,
        still_needed: Callable[[str], bool] | None = None,
    ) -> None:
        """`client`: anything with confluent-kafka's `list_topics`; `servers`: the
        brokers it was given, named when none answers."""
        self._client = client
        self._servers = servers
        self._counts: dict[str, tuple[int, float]] = {}  # topic -> (count, when read)
        self._on_read = on_read
        self._still_needed = still_needed
        self._lock = threading.Lock()
        self._wanted: set[str] = set()
        self._reading = False
        self._stopped = False

    def known(self, topic: str) -> int | None:
        """The count known now, without asking the broker: None when there is none yet
        (the caller then asks `read_ahead`, once what waits for it is in place). A count
        due for its refresh is returned, and read again ahead."""
        known = self._counts.get(topic)
        if known is None:
            return None
        if time.monotonic() - known[1] >= REFRESH_S:
            self.read_ahead([topic])
        return known[0]

    def read_ahead(self, topics: Iterable[str]) -> None:
        """Read these counts on the read-ahead thread (started if none runs)."""
        with self._lock:
            self._wanted.update(topics)
            if self._reading or not self._wanted or self._stopped:
                return
            self._reading = True
        spawn(self._read_wanted)

    def stop(self) -> None:
        """No more reads ahead (the client is closing): one in flight ends within
        `READ_AHEAD_TIMEOUT_S`."""
        with self._lock:
            self._stopped = True

    def _read_wanted(self) -> None:
        while True:
            with self._lock:
                todo = sorted(self._wanted)
                self._wanted.clear()
                if not todo or self._stopped:
                    self._reading = False
                    return
            again, failed = self._read_round(todo)
            if failed:
                time.sleep(RETRY_S)
            with self._lock:
                self._wanted.update(again)

    def _read_round(self, todo: list[str]) -> tuple[list[str], bool]:
        """Read each topic's count once; say which of those sends still wait for, and
        whether a first read failed. A topic read within `REFRESH_S` is not asked again;
        after one request no broker answered, the rest are not asked this round."""
        failed = False
        unanswered: BrokerUnavailableError | None = None
        for topic in todo:
            known = self._counts.get(topic)
            now = time.monotonic()
            if known is not None and now - known[1] < REFRESH_S:
                continue
            count: int | None = None
            error: DelayServiceError | None = unanswered
            if error is None:
                try:
                    count = self.read(topic, READ_AHEAD_TIMEOUT_S)
                except BrokerUnavailableError as exc:
                    error = unanswered = exc
                except DelayServiceError as exc:
                    error = exc
            failed = failed or (error is not None and known is None)
            if known is not None:  # a refresh: a failed one changes nothing until the next
                count = known[0] if count is None else max(count, known[0])
                self._counts[topic] = (count, now)
            elif count is not None:
                self._counts[topic] = (count, now)
            if self._on_read is not None:
                self._on_read(topic, count, None if count is not None else error)
        needed = self._still_needed or (lambda _topic: False)
        return [t for t in todo if t not in self._counts and needed(t)], failed

    def count(self, topic: str) -> int:
        """The topic's partition count, known or read now (waiting up to
        `METADATA_TIMEOUT_S`; raising a retriable `DelayServiceError` that names the
        topic when it cannot be read). Only markers whose id names no partition ask."""
        known = self._counts.get(topic)
        if known is not None:
            return known[0]
        count = self.read(topic, METADATA_TIMEOUT_S)
        self._counts[topic] = (count, time.monotonic())
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
