"""The cancel and reschedule markers a `DelayProducer` sends: what each carries, which
topic and partition it goes to, and when it may go.

A marker is a request about a message already sent, not a message: it has a home of
its own (the markers topic for a level message, the precise topic its id names for an
exact one), an answer to wait for, and an order to keep behind the message it names.
So it is apart from producer.py, which sends messages and keeps `cancel()` and
`reschedule()` with what users read of them; of the producer, markers need only its
levels, `poll()`, `flush()` and what it has in flight (`Owner`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

from delayservice.delay_timing import Delay, DeliverAt, exact_timing
from delayservice.envelope import H_CANCEL, H_DELAY_MS, H_DUE_MS, H_RESCHEDULE, H_VERSION, VERSION
from delayservice.held_sends import Held, HeldSends
from delayservice.levels import LevelSet
from delayservice.markers.level_ids import level_place, marker_partition
from delayservice.markers.precise_ids import named_place, precise_partition
from delayservice.markers.receipt import DeliveryCallback, MarkerReceipt, connection_config
from delayservice.markers.topic_partitions import METADATA_TIMEOUT_S, TopicPartitions
from delayservice.settings import Settings

if TYPE_CHECKING:
    from delayservice.envelope import Headers
    from delayservice.markers.replies import MarkerReply

MARKER_FLUSH_S: Final = 30.0
"""How long a level cancel or reschedule waits for this producer's messages in flight,
so that its marker never reaches the broker before the message it names."""


def _check_id(message_id: object) -> None:
    if not isinstance(message_id, str) or not message_id:
        raise ValueError(f"message_id must be a non-empty string, got {message_id!r}")


class Owner(Protocol):
    """What markers need of the `DelayProducer` that sends them."""

    levels: LevelSet

    def poll(self, timeout: float = 0) -> int: ...

    def flush(self, timeout: float = -1) -> int: ...

    def __len__(self) -> int: ...


class MarkerSends:
    """One producer's markers: `DelayProducer.cancel` and `reschedule` say what they do."""

    def __init__(
        self,
        owner: Owner,
        partitions: TopicPartitions,
        held: HeldSends,
        config: dict[str, Any],
        settings: Callable[[], Settings],
    ) -> None:
        self._owner = owner
        self._partitions = partitions
        self._held = held
        self._reply_config = connection_config(config)
        self._settings = settings
        """The producer's `_exact_settings`: its settings, loaded on first need."""

    def cancel(
        self, message_id: str, wait: float | None, on_delivery: DeliveryCallback | None
    ) -> MarkerReceipt | MarkerReply:
        _check_id(message_id)
        headers: Headers = [(H_VERSION, str(VERSION).encode()), (H_CANCEL, message_id.encode())]
        receipt = self._send_marker("cancel", message_id, headers, on_delivery, wait)
        return receipt if wait is None else receipt.reply(wait)

    def reschedule(
        self,
        message_id: str,
        delay: Delay | None,
        deliver_at: DeliverAt | None,
        wait: float | None,
        on_delivery: DeliveryCallback | None,
    ) -> MarkerReceipt | MarkerReply:
        _check_id(message_id)
        if delay is None and deliver_at is None:
            raise ValueError("pass delay= or deliver_at=")
        if self._marker_home(message_id)[2]:
            timing = exact_timing(delay, deliver_at, self._settings().max_delay_ms)
        else:
            timing = exact_timing(
                delay, deliver_at, self._owner.levels.max_delay_ms, "the top level"
            )
        delay_ms, due_ms = timing if timing is not None else (0, None)
        headers: Headers = [
            (H_VERSION, str(VERSION).encode()),
            (H_RESCHEDULE, message_id.encode()),
            (H_DELAY_MS, str(delay_ms).encode()),
        ]
        if due_ms is not None:
            headers.append((H_DUE_MS, str(due_ms).encode()))
        receipt = self._send_marker("reschedule", message_id, headers, on_delivery, wait)
        return receipt if wait is None else receipt.reply(wait)

    def _send_marker(
        self,
        kind: str,
        message_id: str,
        headers: Headers,
        on_delivery: DeliveryCallback | None,
        wait: float | None,
    ) -> MarkerReceipt:
        """Send a cancel or reschedule marker to where the daemon holding the message
        reads it (`_marker_home`). A caller who waits for the reply hears that the
        outcomes topic is missing, or that no broker answers (`BrokerUnavailableError`,
        within `wait`), before anything is sent."""
        topic, outcomes, exact = self._marker_home(message_id)
        asked_s = max(0.1, min(wait or 0.0, METADATA_TIMEOUT_S))
        if wait is not None and self._partitions.missing(outcomes, asked_s):
            from delayservice.markers.outcome import unavailable

            raise unavailable(outcomes)
        place = named_place(message_id)
        if place is not None:
            partition = place.partition
        elif exact:
            partition = precise_partition(message_id, self._partitions.count(topic))
        else:
            partition = marker_partition(message_id, self._partitions.count(topic))
            if len(self._owner):  # its message may still be on its way: let it land first
                self._owner.flush(MARKER_FLUSH_S)
        receipt = MarkerReceipt(
            kind, message_id, self._owner.poll, self._reply_config, outcomes, on_delivery
        )
        # Behind any record still waiting for this topic's count: an exact message's
        # marker goes to its message's partition, after it.
        kwargs = {"on_delivery": receipt.on_delivery}
        self._held.send_after(Held(topic, partition, None, None, headers, kwargs, time.monotonic()))
        return receipt

    def _marker_home(self, message_id: str) -> tuple[str, str, bool]:
        """(the topic a marker of `message_id` goes to, where it is answered, whether the
        message is exact). An exact id names its topic; a level id, and with precise
        mode off any other id (a level id from before ids named their place: the
        daemon answers `unmatched`), goes to the markers topic; with precise mode on,
        an id of no known form goes to the precise topic, as it always did."""
        settings = self._settings()
        place = named_place(message_id)
        if place is not None:
            topic = settings.precise_far_topic if place.far else settings.precise_topic
            return topic, settings.precise_outcomes_topic, True
        if level_place(message_id) is None and settings.precise:
            return settings.precise_topic, settings.precise_outcomes_topic, True
        return settings.markers_topic, settings.markers_outcomes_topic, False
