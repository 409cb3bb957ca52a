"""How many partitions each topic a producer sends delayed messages to has, as it sees
them: the precise topics, the level topics and the markers topic.

An exact send picks its partition from the count (`ids.precise_id`), a level send from
its key over the count (`DelayProducer`), so a count known
is kept (partitions are never removed, so it stays valid) and refreshed at most every
`REFRESH_S`: producers start using partitions added to a topic within that long, and a
failed refresh changes nothing. A marker needs no count at all when its id names its
partition.

`produce()` never waits for the broker (`known`): counts are read ahead on a thread of
their own, from when the producer is made (`read_ahead`: the topics its settings name),
whenever a send finds a count unknown, and for each refresh, while sends go on with
the count known before. Each answer goes to `on_read`; a count that sends wait for
(`still_needed`) is asked again `RETRY_S` after a read that failed.
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
REFRESH_S: Final = 300.0
"""How often sends look for partitions a topic has gained (librdkafka's
`topic.metadata.refresh.interval.ms` default)."""
READ_AHEAD_TIMEOUT_S: Final = 1.0
"""How long one read ahead waits for an answer: short, because `close()` waits for a
read in flight before it destroys librdkafka's handle (`stop`)."""
RETRY_S: Final = 0.5
"""How soon a count that sends wait for is asked again after a read that failed."""

OnRead = Callable[[str, "int | None", "DelayServiceError | None"], None]
"""Told each answer read ahead: the topic, its count or why there is none."""


def spawn(target: Callable[[], None]) -> None:
    """Runs the reads ahead (tests replace it to run them in line)."""
    threading.Thread(target=target, name="delayservice-partition-counts", daemon=True).start()


def later(delay: float, target: Callable[[], None]) -> None:
    """Runs `target` after `delay` seconds (tests replace it)."""
    timer = threading.Timer(delay, target)
    timer.daemon = True
    timer.start()


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
        self._counts: dict[str, tuple[int, float]] = {}  # topic -> (count, when to read again)
        self._on_read = on_read
        self._still_needed = still_needed
        self._lock = threading.Lock()
        self._read_done = threading.Condition(self._lock)
        """Notified when the read-ahead thread ends (`stop` waits for it)."""
        self._wanted: dict[str, bool] = {}  # topic -> whether a count known is refreshed
        self._urgent: dict[str, bool] = {}  # the same, for topics sends wait for: read first
        self._retry_after: dict[str, float] = {}  # topic -> when a failed read may be retried
        self.failures: dict[str, DelayServiceError] = {}
        """Topic -> why its count, not known yet, could not be read the last time."""
        self._reading = False
        self._stopped = False

    def known(self, topic: str) -> int | None:
        """The count known now, never asking the broker: None when there is none yet
        (it is then read ahead); a count due for its refresh is returned, and read
        again ahead (once per `REFRESH_S`, failed or not)."""
        entry = self._counts.get(topic)
        if entry is None:
            if time.monotonic() >= self._retry_after.get(topic, 0.0):
                self.read_ahead((topic,), urgent=True)
            return None
        if entry[1] <= time.monotonic():
            self._counts[topic] = (entry[0], time.monotonic() + REFRESH_S)
            self.read_ahead((topic,), refresh=True)
        return entry[0]

    def peek(self, topic: str) -> int | None:
        """The count known now, asking nothing."""
        entry = self._counts.get(topic)
        return None if entry is None else entry[0]

    def read_ahead(
        self, topics: Iterable[str], *, refresh: bool = False, urgent: bool = False
    ) -> None:
        """Read these counts on the read-ahead thread (started if none runs)."""
        with self._lock:
            wanted = self._urgent if urgent else self._wanted
            for topic in topics:
                wanted[topic] = wanted.get(topic, False) or refresh
            if self._reading or self._stopped:
                return
            self._reading = True
        spawn(self._read_wanted)

    def stop(self, wait: float = READ_AHEAD_TIMEOUT_S + 0.5) -> bool:
        """No more reads ahead, and wait up to `wait` for one in flight to end (within
        `READ_AHEAD_TIMEOUT_S`): the client is closing, and librdkafka's handle must not
        be destroyed under a call another thread is making on it. False if one still
        runs."""
        with self._lock:
            self._stopped = True
            return self._read_done.wait_for(lambda: not self._reading, wait)

    def _read_wanted(self) -> None:
        while True:
            with self._lock:
                wanted = self._urgent or self._wanted
                if not wanted or self._stopped:
                    self._reading = False
                    self._read_done.notify_all()
                    return
                topic = next(iter(wanted))
                refresh = wanted.pop(topic)
            try:
                self._read_one(topic, refresh)
            except RuntimeError:  # the client was closed under the read
                with self._lock:
                    self._stopped = True
            except:  # a bare KafkaError too (kafka.client_errors): a later read must start
                with self._lock:
                    self._reading = False
                    self._read_done.notify_all()
                raise

    def _read_one(self, topic: str, refresh: bool) -> None:
        known = self._counts.get(topic)
        if known is not None and not refresh:
            return
        count: int | None = None
        error: DelayServiceError | None = None
        try:
            count = self.read(topic, READ_AHEAD_TIMEOUT_S)
        except DelayServiceError as exc:
            error = exc
        now = time.monotonic()
        if known is not None:  # a refresh: a failed one changes nothing until the next
            count = known[0] if count is None else max(count, known[0])
        if count is not None:
            self._counts[topic] = (count, now + REFRESH_S)
            self.failures.pop(topic, None)
            error = None
        else:
            self._retry_after[topic] = now + RETRY_S
            if error is not None:
                self.failures[topic] = error
        if self._on_read is not None:
            self._on_read(topic, count, error)
        if count is None and self._still_needed is not None and self._still_needed(topic):
            later(RETRY_S, lambda: self.read_ahead((topic,), urgent=True))

    def count(self, topic: str) -> int:
        """The topic's partition count, known or read now (waiting up to
        `METADATA_TIMEOUT_S`; raising a retriable `DelayServiceError` that names the
        topic when it cannot be read). Only markers whose id names no partition ask."""
        entry = self._counts.get(topic)
        if entry is not None:
            return entry[0]
        count = self.read(topic, METADATA_TIMEOUT_S)
        self._counts[topic] = (count, time.monotonic() + REFRESH_S)
        return count

    def missing(self, topic: str, timeout: float = METADATA_TIMEOUT_S) -> bool:
        """Whether the broker answered that the topic does not exist. A count already
        known says it does; no answer raises `BrokerUnavailableError`; a topic without a
        leader for now exists."""
        if topic in self._counts:
            return False
        try:
            self._counts[topic] = (self.read(topic, timeout), time.monotonic() + REFRESH_S)
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
