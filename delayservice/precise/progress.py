"""Replicas: owners report what they have forwarded, replicas clean and take over by it.

Each message of a partition is held by its owner and, with two replicas, by one more
member. The owner reports per partition, on a compacted topic keyed by partition:
"every record with offset in [from, through) and due before `due_before` is settled".
`through` is its confirmed commit (all below it is on its disk or settled), `due_before`
the start of its earliest slot that still has a file (all due before it is settled),
and `from` the first offset its current data directory holds: an owner whose disk was
lost and replaced claims nothing that went with the old one.

A replica's copy fires at its due time plus the takeover delay. By then the owner has
normally reported it, and the copy is dropped (cleaned); if not, the owner is gone or
far behind and the replica forwards it. The worst case is a duplicate carrying its
`delay-id`, never a loss. No liveness protocol is needed: every copy is its own timer.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from delayservice.kafka.client_seam import ConsumerClient, ProducerClient
from delayservice.precise.placement import Placement, Role

log = logging.getLogger(__name__)

REPORT_EVERY_S: Final = 1.0
FAR_FUTURE_MS: Final = 2**62


class Report(NamedTuple):
    member: int
    start: int
    through: int
    due_before: int


def parse_report(raw: bytes | None) -> Report | None:
    """A report from the done topic, or None for anything malformed (never raises)."""
    try:
        data = json.loads(raw or b"")
        report = Report(
            int(data["member"]), int(data["from"]), int(data["through"]), int(data["due_before"])
        )
    except Exception:
        return None
    return report


class Progress:
    def __init__(
        self,
        done_topic: str,
        placement: Placement,
        producer: ProducerClient,
        make_consumer: Callable[[dict[str, Any]], ConsumerClient],
        committed: Callable[[int], int | None],
        origin: Callable[[int], int | None],
        earliest_unsettled_ms: Callable[[], dict[int, int]],
    ) -> None:
        self._topic = done_topic
        self._placement = placement
        self._producer = producer
        self._make_consumer = make_consumer
        self._committed = committed
        self._origin = origin
        self._earliest = earliest_unsettled_ms
        self._reports: dict[int, Report] = {}
        self._sent: dict[int, Report] = {}
        self._next_report = 0.0
        self.roles: dict[int, Role] = {}
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._read, name="precise-progress", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stopping.set()
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    # -- owner side ----------------------------------------------------------------
    def report(self) -> None:
        """Publish each owned partition's progress, at most once a second, only when it
        moved. Called from the intake thread."""
        now = time.monotonic()
        if now < self._next_report:
            return
        self._next_report = now + REPORT_EVERY_S
        # `through` is read before the slots: see the module docstring.
        throughs = {p: self._committed(p) for p, role in self.roles.items() if role is Role.OWNER}
        earliest = self._earliest()
        for partition, through in throughs.items():
            start = self._origin(partition)
            if through is None or start is None:
                continue
            report = Report(
                self._placement.member,
                start,
                through,
                earliest.get(partition, FAR_FUTURE_MS),
            )
            if self._sent.get(partition) == report:
                continue
            value = json.dumps(
                {
                    "member": report.member,
                    "from": report.start,
                    "through": report.through,
                    "due_before": report.due_before,
                }
            ).encode()
            self._producer.produce(self._topic, value, str(partition).encode())
            self._sent[partition] = report

    # -- replica side --------------------------------------------------------------
    def covers(self, partition: int, offset: int, due_ms: int) -> bool:
        report = self._reports.get(partition)
        return (
            report is not None
            and report.start <= offset < report.through
            and due_ms < report.due_before
        )

    def _read(self) -> None:
        try:
            consumer = self._make_consumer({})
            consumer.assign([TopicPartition(self._topic, 0, OFFSET_BEGINNING)])
        except Exception:
            log.exception("progress reader for %s could not start", self._topic)
            return
        while not self._stopping.is_set():
            try:
                for message in consumer.consume(500, 0.5):
                    error = message.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            log.info("%s: %s", self._topic, error.str())
                        continue
                    self._take(message.key(), message.value())
            except Exception:
                log.exception("progress reader for %s: unexpected error; continuing", self._topic)
                self._stopping.wait(1.0)
        try:
            consumer.close()
        except Exception:
            log.exception("closing the progress reader failed")

    def _take(self, key: str | bytes | None, value: str | bytes | None) -> None:
        try:
            partition = int(key or b"")
        except ValueError:
            return
        raw = value.encode() if isinstance(value, str) else value
        report = parse_report(raw)
        if report is None or partition % self._placement.members != report.member:
            return  # malformed, or not from the partition's owner
        previous = self._reports.get(partition)
        if previous is None or report.start != previous.start or report.through >= previous.through:
            self._reports[partition] = report
