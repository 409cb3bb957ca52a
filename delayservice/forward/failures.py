"""The slow path of level mode: which record a refusal belongs to, and what happens next.

The forwarder sends without a delivery callback per record; librdkafka reports only
failures (`delivery.report.only.error`), and such a report carries the topic, key and
value it was sent with but not its headers. At a commit point `Failures` matches each
report to the records the interval sent (by target, key and value, which decide every
permanent refusal: an unknown or invalid topic, a size, an authorization) and decides:

- a permanent refusal: the record is *doomed*, and goes to the dead-letter topic with
  its reason when its partition is sent again (a dead letter too large for that topic
  is doomed to a payload-free stub);
- anything else: its partition is held for an exponential backoff and sent again from
  that record on. A record that keeps failing while its target accepted other records
  since its first failure is dead-lettered as `retries_exhausted` after `give_up_s`; an
  outage that refuses everything therefore dead-letters nothing and loses nothing.

A report that matches nothing sent in the interval (it cannot be placed) sends the
whole interval again: a duplicate keeps its `delay-id`, a loss could not be found again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from confluent_kafka import KafkaError, Message

from delayservice.envelope import Headers, unwrap
from delayservice.forward import dead_letter as dl
from delayservice.forward.buffer import Runs
from delayservice.forward.held_record import TARGET, offset_of, record_of
from delayservice.kafka.record_headers import readable_headers
from delayservice.log_throttle import Throttle

log = logging.getLogger(__name__)

TOO_LARGE: Final = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE}
_PERMANENT: Final[dict[int, str]] = {
    KafkaError.UNKNOWN_TOPIC_OR_PART: dl.REASON_UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_TOPIC: dl.REASON_UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION: dl.REASON_UNKNOWN_PARTITION,
    KafkaError.MSG_SIZE_TOO_LARGE: dl.REASON_TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE: dl.REASON_TOO_LARGE,
    KafkaError.TOPIC_AUTHORIZATION_FAILED: dl.REASON_NOT_AUTHORIZED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: dl.REASON_NOT_AUTHORIZED,
    KafkaError.TOPIC_EXCEPTION: dl.REASON_INVALID_TARGET,
    KafkaError.INVALID_RECORD: dl.REASON_REJECTED,
    KafkaError.POLICY_VIOLATION: dl.REASON_REJECTED,
    KafkaError.INVALID_MSG: dl.REASON_REJECTED,
    KafkaError.INVALID_TIMESTAMP: dl.REASON_REJECTED,
    KafkaError.INVALID_REQUIRED_ACKS: dl.REASON_REJECTED,
    KafkaError._INVALID_ARG: dl.REASON_REJECTED,
}
UNKNOWN_TARGET: Final = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC}
PURGED: Final = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
"""What librdkafka reports for a record an abort (or a fatal error) took back."""

Key = tuple[str, int, int]
"""(topic, partition, offset) of a record on a delay topic."""


def permanent_reason(error: KafkaError) -> str | None:
    """The dead-letter reason for an error no retry can fix, else None."""
    return _PERMANENT.get(error.code())


@dataclass(slots=True)
class Doom:
    reason: str
    detail: str
    stub: bool = False


@dataclass(slots=True)
class Failing:
    first_failure: float
    attempts: int = 0


def content(topic: str | None, key: bytes | str | None, value: bytes | str | None) -> tuple:  # type: ignore[type-arg]
    """What an error report and the record it belongs to have in common."""
    return (
        topic,
        key.encode() if isinstance(key, str) else key,
        value.encode() if isinstance(value, str) else value,
    )


Report = tuple[KafkaError, Message, Key | None]
"""A failed delivery, with the record it belongs to when its own callback said so."""


class Failures:
    """Owned by the forwarder thread; only ever busy when something failed."""

    def __init__(
        self,
        dead_letter_topic: str,
        backoff: tuple[float, float],
        give_up_s: float,
        on_retry: Callable[[str, Key], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._dlq = dead_letter_topic
        self._backoff_first, self._backoff_max = backoff
        self._give_up_s = give_up_s
        self._on_retry = on_retry
        self._clock = clock
        self.doomed: dict[Key, Doom] = {}
        self.failing: dict[Key, Failing] = {}
        self.acked_at: dict[str, float] = {}
        self.suspects: set[Key] = set()
        """Records a report could not be pinned to (several sent the same content): they
        go again with a delivery callback each, which names the one that fails."""
        self._throttle = Throttle()

    def targets_accepted(self, runs: Runs) -> None:
        """An interval committed: its targets accepted records (for `retries_exhausted`).
        Parsed again only while something is failing."""
        if not self.failing:
            return
        now = self._clock()
        for _, records in runs:
            for record in records:
                if type(record) is tuple:
                    self.acked_at[record[TARGET]] = now
                    continue
                try:
                    envelope, _, _ = unwrap(readable_headers(record))
                except Exception:  # noqa: S112  # not a forward: nothing accepted
                    continue
                self.acked_at[envelope.target] = now

    def place(
        self,
        reports: list[Report],
        runs: Runs,
        rerouted: dict[Key, str],
        dead_sent: dict[Key, Doom],
    ) -> tuple[set[Key], int]:
        """Decide about each failed report against what the interval sent (`runs`, the
        records it re-published and the dead letters it sent); returns the records to
        send again (doomed ones as dead letters) and the backoff in ms before a retried
        one may go."""
        index: dict[tuple, list[Key]] = {}  # type: ignore[type-arg]
        if any(spot is None for _, _, spot in reports):
            for tp, records in runs:
                for entry in records:
                    record = record_of(tp, entry)
                    spot = (tp[0], tp[1], record.offset() or 0)
                    what = self._content_of(spot, record, rerouted, dead_sent)
                    index.setdefault(what, []).append(spot)
        again: set[Key] = set()
        backoff_ms = 0
        now = self._clock()
        for error, report, named in reports:
            if named is not None:
                spots: list[Key] | None = [named]
            else:
                spots = index.get(content(report.topic(), report.key(), report.value()))
            if not spots:
                log.warning(
                    "a refusal from %s (%s) matches no record sent; sending the interval again",
                    report.topic(),
                    error.str(),
                )
                for (topic, partition), records in runs:
                    again.update((topic, partition, offset_of(r)) for r in records)
                backoff_ms = max(backoff_ms, self.backoff_ms(1))
                continue
            if len(spots) > 1:
                # The same content went more than once: send each again with its own
                # report, so the next failure names its record.
                again.update(spots)
                self.suspects.update(spots)
                continue
            (pinned,) = spots
            again.add(pinned)
            self.suspects.discard(pinned)
            backoff_ms = max(backoff_ms, self._decide(pinned, error, report, now, dead_sent))
        return again, backoff_ms

    def _content_of(
        self, spot: Key, record: Message, rerouted: dict[Key, str], dead_sent: dict[Key, Doom]
    ) -> tuple:  # type: ignore[type-arg]
        doom = dead_sent.get(spot)
        if doom is not None:
            if doom.stub:
                return content(self._dlq, None, None)
            return content(self._dlq, record.key(), record.value())
        if spot in rerouted:
            return content(rerouted[spot], record.key(), record.value())
        try:
            target = unwrap(readable_headers(record))[0].target
        except Exception:
            target = None
        return content(target, record.key(), record.value())

    def _decide(
        self,
        spot: Key,
        error: KafkaError,
        report: Message,
        now: float,
        dead_sent: dict[Key, Doom],
    ) -> int:
        """Doom or retry one record; the backoff in ms (0 for a doom)."""
        was_dead = dead_sent.get(spot)
        if was_dead is not None:
            if error.code() in TOO_LARGE and not was_dead.stub:
                self.doomed[spot] = Doom(was_dead.reason, was_dead.detail, stub=True)
                return 0
            self.doomed[spot] = was_dead  # the dead-letter topic refused: try it again
            return self._retry(spot, error, f"dead-letter topic: {error.str()}", now, None)
        reason = permanent_reason(error)
        if reason is not None:
            self.doomed[spot] = Doom(reason, error.str())
            self.failing.pop(spot, None)
            return 0
        return self._retry(spot, error, error.str(), now, report.topic())

    def _retry(
        self, spot: Key, error: KafkaError, detail: str, now: float, target: str | None
    ) -> int:
        state = self.failing.get(spot)
        if state is None:
            state = self.failing[spot] = Failing(now)
        elif (
            target is not None
            and now - state.first_failure >= self._give_up_s
            and self.acked_at.get(target, float("-inf")) > state.first_failure
        ):
            del self.failing[spot]
            self.doomed[spot] = Doom(
                dl.REASON_RETRIES_EXHAUSTED,
                f"failing for {now - state.first_failure:.0f}s while its target accepted "
                f"other records; last error: {detail}",
            )
            return 0
        state.attempts += 1
        self._on_retry(error.name(), spot)
        delay = self.backoff_ms(state.attempts)
        held_back = self._throttle.allow(("retry", error.name()))
        if held_back is not None:
            log.warning(
                "forward of %s[%d]@%d failed (%s), retry %d in %.1fs%s",
                spot[0],
                spot[1],
                spot[2],
                dl.capped(detail),
                state.attempts,
                delay / 1000,
                f" ({held_back} more failures since the last line)" if held_back else "",
            )
        return delay

    def backoff_ms(self, attempts: int) -> int:
        delay = min(self._backoff_max, self._backoff_first * 2 ** min(max(attempts - 1, 0), 30))
        return max(1, int(delay * 1000))

    def committed(self, runs: Runs) -> None:
        """The interval's records are durable: forget their failures."""
        self.targets_accepted(runs)
        if self.failing or self.doomed:
            for (topic, partition), records in runs:
                for record in records:
                    spot = (topic, partition, offset_of(record))
                    self.failing.pop(spot, None)
                    self.doomed.pop(spot, None)
        if self.suspects:
            for (topic, partition), records in runs:
                for record in records:
                    self.suspects.discard((topic, partition, offset_of(record)))

    def forget(self, tps: set[tuple[str, int]]) -> None:
        for table in (self.doomed, self.failing):
            for spot in [s for s in table if s[:2] in tps]:
                del table[spot]
        self.suspects = {s for s in self.suspects if s[:2] not in tps}


def dead_letter_copy(
    record: Message, doom: Doom, origin_topic: str
) -> tuple[bytes | None, bytes | None, Headers]:
    """Key, value and headers of the dead letter for `record` (a stub has no payload)."""
    original = readable_headers(record)
    origin = (origin_topic, record.partition() or 0, record.offset() or 0)
    key, value = record.key(), record.value()
    key_b = key.encode() if isinstance(key, str) else key
    value_b = value.encode() if isinstance(value, str) else value
    if doom.stub:
        headers = dl.stub_headers(key_b, value_b, original, doom.reason, doom.detail, origin)
        return None, None, headers
    return key_b, value_b, dl.dead_letter_headers(original, doom.reason, doom.detail, *origin)
