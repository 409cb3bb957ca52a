"""An intake over a real slot directory and cancel log, with a scripted consumer and a
stand-in for the forwarder that only dead letters reach."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from confluent_kafka import Message, TopicPartition
from prometheus_client import CollectorRegistry

from delayservice.envelope import H_CANCEL, H_DELAY_MS, H_DUE_MS, H_RESCHEDULE, H_VERSION, Envelope
from delayservice.markers.replies import Answered
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.precise.intake.admission import Admission
from delayservice.precise.intake.intake import Intake
from delayservice.precise.intake.offset_ledger import LevelLedger
from delayservice.precise.placement import Placement
from delayservice.precise.precise_worker import PreciseLevel
from delayservice.precise.storage.cancel_log import CancelLog
from delayservice.precise.storage.data_dir import DataDirWatch
from delayservice.precise.storage.intake_offsets import IntakeOffsets
from delayservice.precise.storage.reschedule_log import RescheduleLog
from delayservice.precise.storage.slot_record import SlotRecord
from delayservice.precise.storage.slot_store import SlotStore
from delayservice.precise.wheel.wheel import Wheel
from tests.level.fakes import message

TOPIC = "precise"
NOW_MS = 1_800_000_000_000
FAR_MS = 3_600_000  # due in an hour: the record stays on disk


def record(
    offset: int, *, partition: int = 0, cancel: str | None = None, message_id: str | None = None
) -> Message:
    """A message due in an hour (id `id-P-O` unless given), or a cancel marker."""
    if cancel is None:
        mid = message_id or f"id-{partition}-{offset}"
        headers = Envelope("orders", FAR_MS, mid).headers()
        return message(partition, offset, NOW_MS, headers=headers, topic=TOPIC)
    headers = [(H_VERSION, b"1"), (H_CANCEL, cancel.encode())]
    return message(partition, offset, NOW_MS, headers=headers, key=None, value=None, topic=TOPIC)


def reschedule(
    offset: int,
    message_id: str,
    *,
    delay_ms: int | None = None,
    due_ms: int | None = None,
    partition: int = 0,
) -> Message:
    """A reschedule marker, appended at NOW_MS, as `DelayProducer.reschedule` sends it."""
    headers: list[tuple[str, bytes | None]] = [
        (H_VERSION, b"1"),
        (H_RESCHEDULE, message_id.encode()),
    ]
    if delay_ms is not None:
        headers.append((H_DELAY_MS, str(delay_ms).encode()))
    if due_ms is not None:
        headers.append((H_DUE_MS, str(due_ms).encode()))
    return message(partition, offset, NOW_MS, headers=headers, key=None, value=None, topic=TOPIC)


class Consumer:
    """Hands out the queued batches one per consume(), then nothing."""

    def __init__(self, partitions: int = 1) -> None:
        self.partitions = partitions
        self.batches: list[list[Message]] = []
        self.committed_offsets: dict[int, int] = {}
        self.closed = False
        self.lock = threading.Lock()
        self.consumed = threading.Condition(self.lock)
        self.taken = 0
        self.calls: list[tuple[int, float]] = []
        """(num_messages, timeout) of every consume() call."""
        self.handed: list[Message] = []
        self.seeks: list[tuple[int, int]] = []
        self.assigned: list[list[tuple[int, int]]] = []  # (partition, offset) per call
        self.made = 0
        self.fail_next: Exception | None = None
        """Raised by the next consume(), once."""
        self.on_commit: Any = None
        self.answers: list[tuple[Any, list[TopicPartition]]] = []  # commit results, undelivered
        self.commit_error: Any = None
        """The answer to the next asynchronous commit: refused with this error, once."""
        self.ends: dict[int, int] = {}
        """Each partition's end offset (0 unless set). Nothing is ever committed, by
        the broker's word (`committed`)."""

    def make(self, config: dict[str, Any]) -> Consumer:
        self.made += 1
        self.closed = False
        self.on_commit = config.get("on_commit")
        return self

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        class Topic:
            error = None
            partitions = dict.fromkeys(range(self.partitions))

        return type("Meta", (), {"topics": {TOPIC: Topic}})

    def committed(self, partitions: list[TopicPartition], timeout: float = -1) -> Any:
        return [TopicPartition(TOPIC, tp.partition, -1001) for tp in partitions]

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned.append([(tp.partition, tp.offset) for tp in partitions])

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        """As librdkafka's: the answers to asynchronous commits come back here."""
        with self.lock:
            answers, self.answers = self.answers, []
        for error, answer in answers:
            self.on_commit(error, answer)
        with self.lock:
            failure, self.fail_next = self.fail_next, None
            if failure is not None:
                raise failure
            self.calls.append((num_messages, timeout))
            if self.batches:
                self.taken += 1
                self.consumed.notify_all()
                batch = self.batches.pop(0)
                self.handed.extend(batch)
                return batch
        threading.Event().wait(min(timeout, 0.01))
        with self.lock:
            self.consumed.notify_all()
        return []

    def seek(self, partition: TopicPartition) -> None:
        """As librdkafka's: the partition is read again from the offset (what was
        handed out from there on comes first)."""
        with self.lock:
            self.seeks.append((partition.partition, partition.offset))
            again = [
                m
                for m in self.handed
                if m.partition() == partition.partition and (m.offset() or 0) >= partition.offset
            ]
            self.handed = [m for m in self.handed if m not in again]
            if again:
                self.batches.insert(0, again)

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> Any:
        with self.lock:
            answer = [TopicPartition(TOPIC, tp.partition, tp.offset) for tp in offsets]
            if asynchronous:
                error, self.commit_error = self.commit_error, None
                if error is None:
                    for tp in offsets:
                        self.committed_offsets[tp.partition] = tp.offset
                self.answers.append((error, answer))
                return None
            for tp in offsets:
                self.committed_offsets[tp.partition] = tp.offset
        return answer

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return partitions

    def get_watermark_offsets(self, partition: TopicPartition, **_kwargs: Any) -> tuple[int, int]:
        return 0, self.ends.get(partition.partition, 0)

    def close(self) -> None:
        self.closed = True

    def wait_drained(self, timeout: float = 10) -> None:
        with self.lock:
            assert self.consumed.wait_for(lambda: not self.batches, timeout)


class DeadLetters:
    """Stands in for the forwarder: only dead letters reach it from the intake."""

    def __init__(self) -> None:
        self.submitted: list[SlotRecord] = []

    def submit(self, record: SlotRecord) -> None:
        self.submitted.append(record)


class Rig:
    def __init__(self, root: Path, partitions: int = 1) -> None:
        self.metrics = metrics = ServiceMetrics(CollectorRegistry())
        self.root = root
        self.fatal: list[str] = []
        fault = self._fault
        self.store = SlotStore(root / "slots", on_fault=fault)
        self.cancels = CancelLog(root / "cancels.log", on_fault=fault)
        self.reschedules = RescheduleLog(root / "reschedules.log", on_fault=fault)
        self.intake_offsets = IntakeOffsets(root / "offsets", on_fault=fault)
        self.answered: list[Answered] = []
        self.answer_fails: Exception | None = None
        self.hold_answers = False
        """Replies wait until `release_answers` is set: the window, after a batch is on
        disk and before its offsets commit, that a kill -9 can land in."""
        self.answering = threading.Event()
        self.release_answers = threading.Event()
        self.consumer = Consumer(partitions)
        self.dead = DeadLetters()
        placement = Placement(1, 0, 1)
        self.wheel = wheel = Wheel(
            self.store,
            self.cancels,
            self.reschedules,
            placement,
            cast(Any, Outcomes()),
            lookahead_s=2.0,
            clock=lambda: NOW_MS / 1000,
            unread=self.intake_offsets.in_flight(),
        )
        level = PreciseLevel(0, 0, TOPIC)
        self.intake = Intake(
            TOPIC,
            self.consumer.make,
            wheel,
            self.store,
            self.cancels,
            self.reschedules,
            LevelLedger(),
            Admission(level, 86_400_000, frozenset({TOPIC}), metrics),
            self.dead.submit,
            placement,
            metrics,
            intake_offsets=self.intake_offsets,
            level_name="exact",
            takeover_ms=0,
            max_delay_ms=86_400_000,
            on_fatal=self.fatal.append,
            check_storage=DataDirWatch(
                root / "slots", root / "cancels.log", root / "reschedules.log"
            ).check,
            answer=self._answer,
        )

    def _fault(self, fault: Exception) -> None:
        self.fatal.append(str(fault))

    def feed(self, *batches: list[Message]) -> None:
        with self.consumer.lock:
            self.consumer.batches.extend(batches)

    def run_batch(self, batch: list[Message]) -> None:
        """One batch through the running intake, and the commit after it."""
        self.feed(batch)
        self.consumer.wait_drained()
        assert wait(lambda: not self.intake.is_alive() or self._committed_past(batch))

    def _committed_past(self, batch: list[Message]) -> bool:
        last = batch[-1]
        return self.consumer.committed_offsets.get(last.partition() or 0, -1) > (last.offset() or 0)

    def _answer(self, answered: list[Answered]) -> None:
        """What the replies' producer does: acknowledged, unless told to fail once."""
        if self.hold_answers:
            self.answering.set()
            self.release_answers.wait()
        failure, self.answer_fails = self.answer_fails, None
        if failure is not None:
            raise failure
        self.answered.extend(answered)

    def replies(self) -> list[tuple[int, str, str, int | None]]:
        """(marker offset, id, outcome, due ms) of every reply so far."""
        return [
            (a.offset, a.reply.message_id, a.reply.outcome, a.reply.due_ms) for a in self.answered
        ]

    def stop(self) -> None:
        self.intake.request_stop()
        assert self.intake.join(10)


class Outcomes:
    def cancelled(self, outcome: str, count: int = 1) -> None:
        pass

    def cleaned(self) -> None:
        pass

    def took_over(self) -> None:
        pass


def wait(condition: Callable[[], bool], timeout: float = 10) -> bool:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return True
        done.wait(0.01)
    return condition()


@contextmanager
def running(root: Path, partitions: int = 1) -> Iterator[Rig]:
    """A rig whose intake runs until the block ends (it may have stopped by itself)."""
    made = Rig(root, partitions)
    made.intake.start()
    try:
        yield made
    finally:
        made.intake.request_stop()
        assert made.intake.join(10)
