"""What `cancel()` and `reschedule()` return: where the marker landed, then what the
daemon did with it.

A marker is an ordinary record, so its delivery report says only that the broker has
it. The daemon holding the message replies on the outcomes topic once the outcome is
durable (`markers.replies`): `accepted` (a cancel kept), `moved` (a reschedule
done), `too_late`, `unmatched`, `cancelled` (a cancel came first) or `refused`. A
receipt reads that reply from the marker's append time on (`wait_for_reply`), so it
holds no client while nobody asks and a caller may ask long after sending.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

from delayservice.errors import DelayServiceError

if TYPE_CHECKING:
    from delayservice.markers.replies import MarkerReply

DeliveryCallback = Callable[[Any, Any], None]

_CONNECTION_PREFIXES: Final = ("security.", "sasl.", "ssl.", "socket.", "broker.", "https.")
_CONNECTION_KEYS: Final = frozenset(
    {
        "bootstrap.servers",
        "metadata.broker.list",
        "client.dns.lookup",
        "client.rack",
        "enable.ssl.certificate.verification",
        "enable.sasl.oauthbearer.unsecure.jwt",
        "logger",
        "error_cb",
        "oauth_cb",
    }
)


def connection_config(producer_config: dict[str, Any]) -> dict[str, Any]:
    """The keys of an application's producer config that say how to reach and log in to
    the cluster: the reply reader connects as the producer does, without the producer's
    own keys (which a consumer would warn about, or refuse: `on_delivery`)."""
    return {
        key: value
        for key, value in producer_config.items()
        if key in _CONNECTION_KEYS or key.startswith(_CONNECTION_PREFIXES) or "oauthbearer" in key
    }


class MarkerNotDeliveredError(DelayServiceError):
    """The broker did not take the marker: nothing was asked of the daemon."""


class NoReplyError(DelayServiceError, TimeoutError):
    """No reply within the time given. The marker is written and takes effect when the
    daemon holding its partition reads it: a later wait may still get the reply."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=True)


class MarkerReceipt:
    """One cancel or reschedule marker. `landed()` waits for the broker's
    acknowledgement, `reply()` for the daemon's answer; both take a timeout in seconds
    and may be called again after one runs out."""

    def __init__(
        self,
        kind: str,
        message_id: str,
        poll: Callable[[float], object],
        client: dict[str, Any],
        outcomes_topic: str,
        on_delivery: DeliveryCallback | None,
    ) -> None:
        self.kind = kind
        self.message_id = message_id
        self._poll = poll
        self._client = client
        self._outcomes_topic = outcomes_topic
        self._user_callback = on_delivery
        self._sent_ms = int(time.time() * 1000)
        self._delivered = threading.Event()
        self._error: Any = None
        self._where: tuple[str, int, int] | None = None
        self._appended_ms: int | None = None

    def on_delivery(self, err: Any, msg: Any) -> None:
        """The marker's delivery report (librdkafka calls it from `poll()`)."""
        if err is None:
            self._where = (msg.topic(), msg.partition(), msg.offset())
            kind, stamp = msg.timestamp()
            self._appended_ms = stamp if kind != TIMESTAMP_NOT_AVAILABLE else None
        self._error = err
        self._delivered.set()
        if self._user_callback is not None:
            self._user_callback(err, msg)

    def landed(self, timeout: float = 30.0) -> tuple[str, int, int]:
        """Where the marker landed: topic, partition, offset. Raises
        MarkerNotDeliveredError if the broker refused it, NoReplyError by `timeout`."""
        deadline = time.monotonic() + timeout
        while not self._delivered.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                raise NoReplyError(
                    f"{self.kind} of {self.message_id}: not acknowledged within {timeout:g} s"
                )
            self._poll(min(0.1, left))
        if self._error is not None:
            raise MarkerNotDeliveredError(
                f"{self.kind} of {self.message_id} not delivered: {self._error.str()}",
                code=self._error.code(),
                retriable=bool(self._error.retriable()),
            )
        if self._where is None:
            raise AssertionError("a delivered marker has a topic, partition and offset")
        return self._where

    def reply(self, timeout: float = 30.0) -> MarkerReply:
        """The daemon's reply (`.outcome`, `.applied`, a move's `.due_ms`), waiting at
        most `timeout` seconds in all. Raises NoReplyError when none came in time, and
        `RepliesUnavailableError` when the outcomes topic cannot be read."""
        # Imported here: `import delayservice` stays clear of the Kafka tooling.
        from delayservice.markers.outcome import wait_for_reply
        from delayservice.markers.replies import REPLY_SKEW_MS

        deadline = time.monotonic() + timeout
        where = self.landed(timeout)
        # Replies carry the replying host's clock: read from before the marker by as
        # much as that clock may lag the broker's (or this host's, when the broker
        # gave no append time).
        since_ms = min(self._appended_ms or self._sent_ms, self._sent_ms) - REPLY_SKEW_MS
        left = max(0.0, deadline - time.monotonic())
        reply = wait_for_reply(self._client, self._outcomes_topic, where, since_ms, left)
        if reply is None:
            topic, partition, offset = where
            raise NoReplyError(
                f"{self.kind} of {self.message_id}: no reply within {timeout:g} s; the marker "
                f"is on {topic} partition {partition} offset {offset} and takes effect when "
                "the daemon holding that partition reads it (is it running?)"
            )
        return reply
