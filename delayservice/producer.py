"""DelayProducer: a drop-in for `confluent_kafka.Producer` that can delay a message.

The application keeps its librdkafka config and its `produce()` calls and adds
`delay=` or `deliver_at=`. A delayed message goes to the level topic its delay selects,
with the envelope in headers; an undelayed one goes straight to its topic. Levels and
topic names come from the settings the daemon reads (`load_settings`: the
`DELAYSERVICE_*` variables and the file `DELAYSERVICE_CONFIG` or `config_file=` names),
so a producer deployed beside a daemon agrees with it.

A level message goes to the partition of its level topic that the application's
partitioner gives its key (a key's messages keep their order within a level; a message
without a key goes to a partition picked for a while), and its id names the level, that
partition and when it was sent (`markers.level_ids`).

With `precision="exact"` a delayed message goes instead to a precise topic, where the
precise-mode daemon forwards it at exactly its due time (any delay up to `max_delay`):
the precise topic up to `precise_far_after`, the far topic beyond, so that far-future
messages are read by an intake of their own. An exact message's id names the topic and
the partition it was sent to (`ids.precise_id`).

`cancel()` withdraws a message and `reschedule()` moves it, in both modes, and say what
the daemon did (`MarkerReceipt`). A level message's markers go to the markers topic,
which every daemon reads whole; an exact message's go to the partition its id names, so
the instances holding the message read them however many partitions the topic has
gained since (`marker_sends`).

`produce()` never waits for the broker. The partition counts of the topics the settings
name are read ahead from construction, and refreshed in the background while sends go
on with the count known before. A delayed record sent before its topic's count is known
takes its partition (and its id) over `settings.partitions`, the count `topics create`
gives, and waits in the producer (`held_sends`) until the count is read; then it goes
out, in the order sent, before anything later of its topic. It fails through its
delivery callback when the topic does not exist or `message.timeout.ms` passes, as
librdkafka fails what it cannot route; `flush()` and `close()` bound the wait.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, cast

from confluent_kafka import Producer

from delayservice import partitioners
from delayservice.delay_timing import Delay, DeliverAt, delay_to_ms, exact_timing
from delayservice.envelope import Envelope, Headers, new_id, wrap
from delayservice.errors import DelayServiceError
from delayservice.held_sends import Held, HeldSends
from delayservice.levels import Level, LevelSet
from delayservice.marker_calls import CancelCall, RescheduleCall, named
from delayservice.marker_sends import MarkerSends
from delayservice.markers.level_ids import level_id
from delayservice.markers.precise_ids import precise_id, precise_partition
from delayservice.markers.receipt import DeliveryCallback, MarkerReceipt
from delayservice.markers.topic_partitions import TopicPartitions, servers_of
from delayservice.settings import Settings
from delayservice.settings_loading import load_settings

if TYPE_CHECKING:
    from delayservice.markers.replies import MarkerReply

__all__ = [
    "PRECISIONS",
    "DelayProducer",
    "MarkerReceipt",
    "Precision",
    "delay_to_ms",
    "exact_timing",
    "precise_partition",
]
STICKY_S: Final = 0.01
"""How long messages without a key keep going to one partition of a level (librdkafka's
`sticky.partitioning.linger.ms`): batches stay whole, and load still spreads."""

Precision = Literal["level", "exact"]
"""`level`: the smallest level at least as long as the delay (the default). `exact`: the
precise topic, delivered at the requested time."""
PRECISIONS: Final = ("level", "exact")


def _checked_precision(precision: str) -> Precision:
    if precision == "level":
        return "level"
    if precision == "exact":
        return "exact"
    raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


_IDEMPOTENCE_CONFLICTS: Final[dict[str, Callable[[Any], bool]]] = {
    "acks": lambda v: str(v) not in ("all", "-1"),
    "request.required.acks": lambda v: str(v) not in ("all", "-1"),
    "max.in.flight.requests.per.connection": lambda v: int(v) > 5,
    "max.in.flight": lambda v: int(v) > 5,
    "retries": lambda v: int(v) == 0,
    "message.send.max.retries": lambda v: int(v) == 0,
}


def with_idempotence(config: dict[str, Any]) -> dict[str, Any]:
    """`config`, idempotent unless it says otherwise: a key's records keep their order
    within a level only if a retried batch cannot land behind a later one (the Java
    client's default since Kafka 3.0; librdkafka's is off). Left as it is when it sets
    `enable.idempotence`, or a key idempotence refuses (acks below all, more than five
    requests in flight, no retries)."""
    if "enable.idempotence" in config:
        return config
    for key, conflicts in _IDEMPOTENCE_CONFLICTS.items():
        if key in config:
            try:
                if conflicts(config[key]):
                    return config
            except (TypeError, ValueError):
                return config  # librdkafka says what is wrong with the value
    return {**config, "enable.idempotence": True}


class DelayProducer:
    """Wraps a `confluent_kafka.Producer`; every attribute not defined here passes through.

    `precision` is the default for `produce()`: "level" (the level topics) or "exact"
    (the precise topic); each call may override it. Settings come from `settings`, else
    from `load_settings(config_file)`, which reads what the daemon reads.
    """

    def __init__(
        self,
        config: dict[str, Any],
        *,
        settings: Settings | None = None,
        levels: LevelSet | None = None,
        precision: Precision = "level",
        config_file: Path | str | None = None,
    ) -> None:
        self.precision = _checked_precision(precision)
        if settings is not None and config_file is not None:
            raise ValueError("pass settings= or config_file=, not both")
        self._config_file = config_file
        if levels is None:
            settings = settings or load_settings(config_file)
            levels = settings.level_set()
        elif settings is None and self.precision == "exact":
            settings = load_settings(config_file)  # a configuration error shows now
        self.levels = levels
        self._settings = settings
        self._producer = Producer(with_idempotence(config))
        self._partitioner = partitioners.configured(config)
        """Written in every envelope: the daemon places a keyed record with it, on the
        partition an undelayed send through this producer would reach."""
        self._partitions = TopicPartitions(
            self._producer, servers_of(config), self._count_read, self._waits_for
        )
        self._held = HeldSends(
            self._producer.produce, self._partitions.known, config, self._partitions.failures
        )
        self._assumed = (settings or Settings.model_construct()).partitions
        """The count a delayed send picks its partition over while its topic's is not
        known yet: the one `topics create` gives."""
        self._partitions.read_ahead(self._topics_ahead())
        self._markers = MarkerSends(
            self, self._partitions, self._held, config, self._exact_settings
        )
        self._sticky: dict[str, tuple[int, float]] = {}
        """Level topic -> (the partition keyless messages go to, until when)."""

    def produce(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        partition: int = -1,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Headers | dict[str, str | bytes | None] | None = None,
        *,
        delay: Delay | None = None,
        deliver_at: DeliverAt | None = None,
        callback: DeliveryCallback | None = None,
        precision: Precision | None = None,
    ) -> str:
        """Send now, or after `delay`; returns the message id (`delay-id`).

        `delay` is seconds, a timedelta or a duration such as "30s"; `deliver_at` epoch
        seconds or an aware datetime. A negative, NaN or infinite delay or a naive
        datetime raises ValueError; zero (or a `deliver_at` already past) sends at once.
        `precision` overrides the producer's default for this message. A delay above
        the top level (or, exact, above `max_delay`) raises `DelayTooLongError`. All of
        these before anything is sent. `on_delivery` confirms the write to the delay
        topic (or, undelayed, to `topic`), not the forward, which happens when due.
        """
        on_delivery = on_delivery or callback
        kwargs: dict[str, Any] = {"timestamp": timestamp}
        if on_delivery is not None:
            kwargs["on_delivery"] = on_delivery
        user_headers: Headers | None = (
            list(headers.items()) if isinstance(headers, dict) else headers
        )
        mode = self.precision if precision is None else _checked_precision(precision)
        delay_ms: int | None = None
        if mode == "exact":
            timing = exact_timing(delay, deliver_at, self._exact_settings().max_delay_ms)
            if timing is not None:
                precise_topic, far = self._precise_route(*timing)
                count = self._partitions.known(precise_topic)
                message_id, place = precise_id(self._assumed if count is None else count, far=far)
                envelope = Envelope(
                    topic,
                    timing[0],
                    message_id,
                    partition if partition >= 0 else None,
                    timing[1],
                    partitioner=self._partitioner if partition < 0 else None,
                )
                wrapped = wrap(envelope, user_headers)  # refuses `delay-*` user headers
                if count is not None and not self._held.topics:
                    self._producer.produce(
                        precise_topic, value, key, partition=place, headers=wrapped, **kwargs
                    )
                else:
                    self._hold(Held(precise_topic, place, value, key, wrapped, kwargs, 0.0), count)
                return message_id
        else:
            delay_ms = delay_to_ms(delay, deliver_at)
        if delay_ms is None:
            if partition >= 0:
                kwargs["partition"] = partition
            self._producer.produce(topic, value, key, headers=user_headers, **kwargs)
            return new_id()
        level = self.levels.select(delay_ms)
        count = self._partitions.known(level.topic)
        place = self._level_partition(level, key, self._assumed if count is None else count)
        message_id = level_id(level.index, place)
        envelope = (
            Envelope(topic, delay_ms, message_id, partition)
            if partition >= 0
            else Envelope(topic, delay_ms, message_id, partitioner=self._partitioner)
        )
        wrapped = wrap(envelope, user_headers)
        if count is not None and not self._held.topics:
            self._producer.produce(
                level.topic, value, key, partition=place, headers=wrapped, **kwargs
            )
        else:
            self._hold(Held(level.topic, place, value, key, wrapped, kwargs, 0.0), count)
        return message_id

    def _hold(self, record: Held, count: int | None) -> None:
        """Send `record` behind what waits for its topic's count, or wait with them
        (`HeldSends`)."""
        self._held.send(record._replace(since=time.monotonic()), count)

    def _count_read(self, topic: str, count: int | None, error: DelayServiceError | None) -> None:
        self._held.release(topic, count, error)

    def _waits_for(self, topic: str) -> bool:
        return self._held.waits_for(topic)

    def _level_partition(self, level: Level, key: bytes | str | None, count: int) -> int:
        """The partition among `count` of `level`'s topic for a message with `key`: the
        one this producer's partitioner gives the key, as an undelayed send would be
        placed; a sticky one for a message without a key (or under `random`)."""
        raw = key.encode() if isinstance(key, str) else key
        placed = partitioners.keyed_partition(self._partitioner, raw, count)
        if placed is not None:
            return placed
        now = time.monotonic()
        sticky = self._sticky.get(level.topic)
        if sticky is None or sticky[1] <= now or sticky[0] >= count:
            sticky = (random.randrange(count), now + STICKY_S)  # not security
            self._sticky[level.topic] = sticky
        return sticky[0]

    def _cancel(
        self,
        message_id: str,
        *,
        wait: float | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> MarkerReceipt | MarkerReply:
        """Ask the daemon not to forward the message with `message_id`, level or exact.

        Sends a cancel marker (no key, no value; headers `delay-v` and `delay-cancel`):
        for a level message to the markers topic, which every daemon reads, after this
        producer's messages in flight are acknowledged (so the marker never reaches the
        broker before the message); for an exact one to the precise-topic partition its
        id names (see `precise_partition`), however many partitions the topic has now.
        It works whatever this producer's default precision is. A cancel the broker
        acknowledges before the message is due is honoured (level mode: whatever
        happens to the daemon; precise mode: once the daemon has read it).

        With `wait` (seconds) it returns the daemon's reply: `applied` when it will not
        be delivered (outcome `cancelled` for a level message, `accepted` for an exact
        one), else `too_late` (it was due first), `unmatched` (no such message there; an
        id from before level ids named their place) or `refused`; `NoReplyError` if none
        came in time. Without, it returns a `MarkerReceipt` at once, whose
        `reply(timeout)` waits later. `on_delivery` reports where the marker landed, as
        for `produce()`.
        """
        return self._markers.cancel(message_id, wait, on_delivery)

    cancel = cast("CancelCall[MarkerReceipt, MarkerReply]", named(_cancel, "cancel"))

    def _reschedule(
        self,
        message_id: str,
        *,
        delay: Delay | None = None,
        deliver_at: DeliverAt | None = None,
        wait: float | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> MarkerReceipt | MarkerReply:
        """Move a pending message, level or exact, to a new due time, earlier or later.

        Sends a reschedule marker (no key, no value; headers `delay-v`,
        `delay-reschedule`, and `delay-ms` or `delay-due-ms`) where `cancel` sends a
        cancel. `delay` counts from when the broker appends the marker; `deliver_at` is
        an absolute time. The message keeps its id, key, value and headers and is
        delivered once: an exact one at the new time; a level one at the smallest level
        at least as long as what is left then, never before the new time. A time in the
        past means now. A cancel always wins over a reschedule, whichever came first. A
        time beyond `max_delay` (exact) or the top level (level) raises
        `DelayTooLongError` before anything is sent.

        With `wait` (seconds) it returns the daemon's reply: outcome `moved` (with the
        new `due_ms`), `too_late` (already sent), `unmatched`, `cancelled` or
        `refused`; without, a `MarkerReceipt`, as `cancel` does.
        """
        return self._markers.reschedule(message_id, delay, deliver_at, wait, on_delivery)

    reschedule = cast(
        "RescheduleCall[MarkerReceipt, MarkerReply]", named(_reschedule, "reschedule")
    )

    def _precise_route(self, delay_ms: int, due_ms: int | None) -> tuple[str, bool]:
        """The precise topic for a message due within `precise_far_after`, else the
        far topic; and whether it is the far one."""
        settings = self._exact_settings()
        ahead_ms = max(delay_ms, (due_ms or 0) - time.time() * 1000)
        if ahead_ms > settings.precise_far_after_ms:
            return settings.precise_far_topic, True
        return settings.precise_topic, False

    def _exact_settings(self) -> Settings:
        """Loaded on first need when only `levels=` was given, so a level producer that
        never sends exact messages or cancels never reads settings."""
        if self._settings is None:
            self._settings = load_settings(self._config_file)
        return self._settings

    def _topics_ahead(self) -> list[str]:
        """The topics whose counts sends will need, read from the start: the level
        topics, the precise ones when this producer sends exact messages, and the
        markers topic."""
        topics = [level.topic for level in self.levels]
        settings = self._settings
        if settings is not None and (self.precision == "exact" or settings.precise):
            topics += [settings.precise_topic, settings.precise_far_topic]
        if settings is not None:
            topics.append(settings.markers_topic)  # a level cancel's marker needs it
        return topics

    def poll(self, timeout: float = 0) -> int:
        """librdkafka's `poll()`; first, what waited for a partition count known now
        goes out, and the callbacks of delayed records that failed before reaching
        librdkafka are called (`HeldSends`)."""
        served = self._held.serve() if self._held.busy else 0
        return served + int(self._producer.poll(0 if served else timeout))

    def flush(self, timeout: float = -1) -> int:
        """Wait at most `timeout` seconds (-1: until each record is delivered or has
        failed, within `message.timeout.ms`) for delayed records waiting for their
        topic's partition count and for librdkafka's queue; how many are left."""
        deadline = None if timeout < 0 else time.monotonic() + timeout
        while self._held.busy:
            self._held.serve()
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if not self._held.topics or left <= 0:
                break
            if len(self._producer):  # make room for what waits
                self._producer.flush(min(left, 0.05))
            else:
                self._held.wait(min(left, 0.05))
        left = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        remaining = int(self._producer.flush(left))
        self._held.serve()
        return remaining + len(self._held)

    def close(self, *args: Any, **kwargs: Any) -> Any:
        """Fail what still waits for a partition count through its delivery callback
        (`_PURGE_QUEUE`), stop reading counts ahead, and close librdkafka's producer."""
        self._partitions.stop()
        self._held.purge()
        self._held.serve()
        return self._producer.close(*args, **kwargs)

    def __len__(self) -> int:
        return len(self._producer) + len(self._held)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def __enter__(self) -> DelayProducer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        remaining = self.flush(30)
        if remaining and exc_type is None:
            raise DelayServiceError(
                f"{remaining} messages were not delivered before close", retriable=True
            )
