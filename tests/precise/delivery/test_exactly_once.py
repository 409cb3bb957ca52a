"""Precise mode exactly-once on fakes: what a read_committed reader of the target sees
across a kill after a commit, a kill inside a transaction, and a commit whose outcome
is unknown (the coordinator completed it, or aborted it); and the replies to markers
committing in the same transactions."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from prometheus_client import CollectorRegistry

from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.precise.delivery.delivered_position import read_position, write_position
from delayservice.precise.delivery.delivery_log import NOTE_EVERY_S
from delayservice.precise.delivery.sent_records import decode_sent, encode_sent
from delayservice.precise.precise_worker import PreciseWorker
from tests.level.fakes import DLQ, FakeClock, FakeProducer, Sent, wait_for
from tests.precise.eos_rig import (
    DONE_TOPIC,
    OUTCOMES_TOPIC,
    TRANSACTIONAL_ID,
    Process,
    delivered_ids,
    eos_settings,
    sent_records,
)
from tests.precise.txn_fakes import FakeCoordinator
from tests.precise.wheel.test_wheel import SlowDisk


def test_the_delivery_record_round_trips_runs_and_scattered_offsets():
    offsets = {(0, 17): [5, 6, 7, 9, 100, 101, 3], (4, 2**31): [2**40, 2**40 + 1]}
    assert decode_sent(encode_sent(3, offsets)) == {k: set(o) for k, o in offsets.items()}
    assert decode_sent(b"not json") is None
    assert decode_sent(b'{"v": 1, "sent": "AAAA"}') is None


def test_a_transaction_names_what_it_delivered_and_marks_settle_only_after_it_commits(
    tmp_path: Path, coordinator: FakeCoordinator, clock: FakeClock
):
    process = Process(tmp_path, coordinator, clock)
    for offset in range(3):
        process.hold(offset, 0)
    process.hold(3, 30)
    process.forwarder.step()  # sent, inside a transaction that has not committed
    assert process.producer.txn_open
    assert delivered_ids(coordinator) == {}
    assert process.slot_files() == 2  # nothing settles before the commit
    process.step()
    assert delivered_ids(coordinator) == {"id-0": 1, "id-1": 1, "id-2": 1}
    [record] = sent_records(coordinator)
    assert record.key == b"sent:0"
    assert decode_sent(record.value) == {(0, clock.ms() // 1000): {0, 1, 2}}
    assert process.slot_files() == 1  # the due slot went with its last record
    assert process.producer.config["transactional.id"] == TRANSACTIONAL_ID


def test_a_kill_after_a_commit_before_its_marks_sends_nothing_again(
    tmp_path: Path, coordinator: FakeCoordinator, clock: FakeClock
):
    first = Process(tmp_path, coordinator, clock)
    for offset in range(3):
        first.hold(offset, 0)
    first.hold(3, 0.5)
    first.hold(4, 10)
    first.killed_after_commit()
    clock.advance(1)
    assert sorted(delivered_ids(coordinator)) == ["id-0", "id-1", "id-2"]

    again = _restarted_and_drained(first, tmp_path, learned=3, later_s=10)
    assert delivered_ids(coordinator) == {f"id-{o}": 1 for o in range(5)}
    assert again.slot_files() == 0


def _forged(kind: str, second: int) -> bytes:
    """A record under `sent:0` naming offsets 0-2 of slot (0, `second`) delivered, which
    this member's transactions could not have written."""
    named = {(0, second): [0, 1, 2]}
    if kind == "another member's body":
        return encode_sent(1, named)
    if kind == "a replica's body":
        return encode_sent(0, named, writer=1)
    if kind == "a slot that cannot exist":
        return encode_sent(0, {**named, (-1, second): [0]})
    return b'{"v": 1, "member": 0, "sent": "AAAA"}'


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("another member's body", "key_mismatch"),
        ("a replica's body", "key_mismatch"),
        ("a slot that cannot exist", "bad_slot"),
        ("bytes that do not decode", "malformed"),
    ],
)
def test_a_forged_delivery_record_settles_nothing_and_is_counted(
    tmp_path: Path, coordinator: FakeCoordinator, clock: FakeClock, kind: str, reason: str
):
    """A record under this member's key that its transactions could not have written
    (only daemons may write the done topic: docs/security.md) must not settle records
    that were never sent: it is dropped and counted, and every record is delivered."""
    first = Process(tmp_path, coordinator, clock)
    for offset in range(3):
        first.hold(offset, 1)
    first.die()
    forged = _forged(kind, clock.ms() // 1000 + 1)
    coordinator.committed.append(Sent(DONE_TOPIC, b"sent:0", forged, [], 0, None, 0.0))

    again = Process(tmp_path, coordinator, clock)
    clock.advance(2)
    again.load()
    again.step(2)
    assert again.delivery.learned_records == 0
    assert again.dropped == [reason]
    assert delivered_ids(coordinator) == {f"id-{o}": 1 for o in range(3)}


def test_a_kill_while_a_commits_marks_are_still_being_written_sends_nothing_twice(
    tmp_path: Path, coordinator: FakeCoordinator, clock: FakeClock, monkeypatch
):
    """The marks writer writes a commit point's marks off the forwarder's thread: until
    it has, every later transaction names those records again, so the latest record a
    restart learns covers them (issue 46)."""
    first = Process(tmp_path, coordinator, clock)
    first.hold(0, 0)
    first.hold(1, 0.2)
    first.hold(9, 0.5)  # keeps the slot: 0 and 1 settle with marks
    disk = SlowDisk(monkeypatch)
    writer = first.wheel._state.marks_writer
    assert writer is not None
    writer.start()
    disk.armed = True
    first.step()  # 0 committed; its mark stalls in the writer
    assert disk.writing.wait(5)
    clock.advance(0.2)
    first.step()  # 1 committed; 0's mark still not written
    [_, latest] = sent_records(coordinator)
    assert decode_sent(latest.value) == {(0, clock.ms() // 1000): {0, 1}}
    disk.killed = True  # kill -9: the mark never lands
    disk.release.set()
    wait_for(lambda: not first.wheel._state.flush_lock.locked(), "the write to end")
    first.die()
    disk.armed = False

    _restarted_and_drained(first, tmp_path, learned=2, later_s=1)
    assert delivered_ids(coordinator) == {"id-0": 1, "id-1": 1, "id-9": 1}


def _restarted_and_drained(first: Process, root: Path, learned: int, later_s: float) -> Process:
    """A new process over `first`'s directory learns `learned` records delivered, then
    forwards what falls due within `later_s`."""
    again = Process(root, first.coordinator, first.clock)
    again.load()
    again.step()
    assert again.delivery.learned_records == learned
    first.clock.advance(later_s)
    again.load()
    again.step(2)
    return again


def test_a_kill_inside_a_transaction_leaves_its_forwards_unseen_and_sends_them_once(
    tmp_path: Path, coordinator: FakeCoordinator, clock: FakeClock
):
    first = Process(tmp_path, coordinator, clock)
    for offset in range(3):
        first.hold(offset, 0)
    first.forwarder.step()  # sent; the transaction is open when the process dies
    assert len(first.producer.txn_sent) == 3
    first.die()

    again = Process(tmp_path, coordinator, clock)  # its init fences the dead one
    again.load()
    again.step()
    assert first.producer.aborted
    assert not first.producer.txn_open
    assert again.delivery.learned_records == 0
    assert delivered_ids(coordinator) == {f"id-{o}": 1 for o in range(3)}
    assert again.slot_files() == 0


@pytest.mark.parametrize("completed", [True, False], ids=["committed", "aborted"])
def test_a_commit_whose_outcome_is_unknown_is_learned_after_the_fence_never_sent_twice(
    tmp_path: Path, coordinator: FakeCoordinator, clock: FakeClock, completed: bool
):
    """commit_transaction keeps timing out (its outcome unknown): the producer is
    replaced, whose init_transactions ends the transaction either way, and what the
    done topic then says decides which records go again."""
    coordinator.in_flight_completes = completed
    process = Process(tmp_path, coordinator, clock)
    for offset in range(3):
        process.hold(offset, 0)
    process.producer.commit_timeouts = 1_000
    process.step()  # the commit fails for good: a new producer fences the old one
    assert len(process.producers) == 2
    assert process.producers[0].fatal_error is not None  # fenced
    assert process.delivery.learned_records == (3 if completed else 0)
    assert process.slot_files() == 1  # nothing settled on an unknown outcome
    process.step(2)
    assert delivered_ids(coordinator) == {f"id-{o}": 1 for o in range(3)}
    assert process.slot_files() == 0
    assert process.fatal == []


def test_replies_commit_in_the_transaction_and_an_aborted_one_goes_again(
    tmp_path: Path, coordinator: FakeCoordinator, clock: FakeClock
):
    process = Process(tmp_path, coordinator, clock)
    process.hold(0, 0)
    answered: list[BaseException | None] = []

    def answer() -> None:
        try:
            process.delivery.answer([(b"timers:0:7", b'{"outcome":"accepted"}')])
            answered.append(None)
        except BaseException as exc:
            answered.append(exc)

    waiting = threading.Thread(target=answer)
    waiting.start()
    while not process.delivery.pending():
        waiting.join(0.01)
    abortable = KafkaError(KafkaError._TIMED_OUT, "abort it", txn_requires_abort=True)
    process.producer.commit_txn_raises = KafkaException(abortable)
    process.step()
    assert coordinator.visible(OUTCOMES_TOPIC) == []
    assert answered == []  # still waiting: nothing committed the reply
    process.producer.commit_txn_raises = None
    process.step()
    waiting.join(5)
    assert answered == [None]
    assert [s.key for s in coordinator.visible(OUTCOMES_TOPIC)] == [b"timers:0:7"]
    assert delivered_ids(coordinator) == {"id-0": 1}


def test_a_reply_alone_still_commits(
    tmp_path: Path, coordinator: FakeCoordinator, clock: FakeClock
):
    """Nothing due: the forwarder opens a transaction for the replies only."""
    process = Process(tmp_path, coordinator, clock)
    waiting = threading.Thread(
        target=process.delivery.answer, args=([(b"timers:0:9", b'{"outcome":"moved"}')],)
    )
    waiting.start()
    while not process.delivery.pending():
        waiting.join(0.01)
    process.forwarder.step(wait=False)
    clock.advance(1)
    process.forwarder.step(wait=False)
    waiting.join(5)
    assert not waiting.is_alive()
    assert [s.key for s in coordinator.visible(OUTCOMES_TOPIC)] == [b"timers:0:9"]
    assert sent_records(coordinator) == []  # nothing delivered, nothing named


def test_the_worker_forwards_in_transactions_under_its_members_id(tmp_path: Path):
    """`PreciseWorker` under guarantee = exactly-once: its forwarder is transactional,
    with the member's stable id (the far topic's its own), and carries the log."""
    made: list[FakeProducer] = []

    def make_producer(config: dict[str, Any]) -> FakeProducer:
        made.append(FakeProducer(config=config))
        return made[-1]

    settings = eos_settings().model_copy(update={"data_dir": tmp_path})
    workers = [
        PreciseWorker(
            settings,
            ServiceMetrics(CollectorRegistry()),
            FakeProducer(),
            [].append,
            make_producer=make_producer,
            far=far,
        )
        for far in (False, True)
    ]
    try:
        assert [w.forwarder.transactional for w in workers] == [True, True]
        assert [p.config["transactional.id"] for p in made] == [
            "delayservice-precise-0-forward",
            "delayservice-precise-far-0-forward",
        ]
        assert all(w.delivery is not None for w in workers)
    finally:
        for worker in workers:
            worker.disk.close()


def test_a_restart_reads_the_done_topic_from_the_end_noted_once_marks_were_written(
    tmp_path: Path, coordinator: FakeCoordinator, clock: FakeClock
):
    first = Process(tmp_path, coordinator, clock)
    for offset in range(4):
        first.hold(offset, 0)
        first.step()
        clock.advance(NOTE_EVERY_S / 2)  # the end is noted after every second commit
    assert read_position(tmp_path / "timers.delivered") == 3
    first.hold(4, 0)
    first.hold(5, 0)
    again = _killed_after_commit_and_restarted(first, tmp_path)
    assert again.reader.reads == 2  # the noted end on, not the whole topic
    assert again.delivery.learned_records == 2
    assert delivered_ids(coordinator) == {f"id-{o}": 1 for o in range(6)}


def test_a_noted_end_past_the_topics_end_is_ignored(
    tmp_path: Path, coordinator: FakeCoordinator, clock: FakeClock
):
    """The done topic was made again: its offsets start over."""
    write_position(tmp_path / "timers.delivered", 50)
    (tmp_path / "timers.delivered.new").write_text("garbage")
    first = Process(tmp_path, coordinator, clock)
    first.hold(0, 0)
    again = _killed_after_commit_and_restarted(first, tmp_path)
    assert again.delivery.learned_records == 1
    assert delivered_ids(coordinator) == {"id-0": 1}


def _killed_after_commit_and_restarted(process: Process, root: Path) -> Process:
    """`process` is killed right after its next commit, before its marks; a new one
    over the same directory forwards what is due."""
    process.killed_after_commit()
    again = Process(root, process.coordinator, process.clock)
    again.load()
    again.step()
    return again


class _WallClock:
    """The rig's clock, on real time: the forwarder's thread sleeps on it."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def ms(self) -> int:
        return int(time.time() * 1000)


def test_an_idle_forwarder_commits_a_reply_handed_in_right_after_a_commit(
    tmp_path: Path, coordinator: FakeCoordinator
):
    """Nothing due, a commit just made: the forwarder's thread must not sleep until the
    next record falls due while a reply waits for a transaction."""
    process = Process(tmp_path, coordinator, _WallClock())  # type: ignore[arg-type]
    process.hold(0, 0)
    process.hold(1, 3600)  # the next record due: an hour out
    process.forwarder.start()
    try:
        wait_for(lambda: delivered_ids(coordinator) == {"id-0": 1}, "the due record")
        started = time.monotonic()
        process.delivery.answer([(b"timers:0:5", b'{"outcome":"accepted"}')])
        assert time.monotonic() - started < 2.0
    finally:
        process.forwarder.stop(5)
    assert [s.key for s in coordinator.visible(OUTCOMES_TOPIC)] == [b"timers:0:5"]


def test_a_restart_with_nothing_after_the_noted_end_learns_at_once(
    tmp_path: Path, coordinator: FakeCoordinator, clock: FakeClock
):
    """The reader starts at the topic's end: it returns nothing and its position stays
    unknown, which must not read as "not there yet"."""
    first = Process(tmp_path, coordinator, clock)
    first.hold(0, 0)
    first.step()
    clock.advance(NOTE_EVERY_S)
    first.hold(1, 0)
    first.step()  # marks written; the end (2) noted
    first.die()
    assert read_position(tmp_path / "timers.delivered") == 2
    again = Process(tmp_path, coordinator, clock)
    again.delivery._read_timeout = 1.0
    again.load()
    again.step()
    assert again.delivery.learned
    assert again.reader.reads == 0
    assert delivered_ids(coordinator) == {"id-0": 1, "id-1": 1}


def test_a_dead_letter_named_by_the_last_transaction_is_not_sent_again(
    tmp_path: Path, coordinator: FakeCoordinator, clock: FakeClock
):
    """A slot record that could only be dead-lettered settles like a forward: the
    restarted process neither forwards it nor dead-letters it again."""
    first = Process(tmp_path, coordinator, clock)
    first.hold(0, 0, target="no-such-topic")
    first.hold(1, 0)
    again = _killed_after_commit_and_restarted(first, tmp_path)
    assert again.delivery.learned_records == 2
    assert [s.delay_id for s in coordinator.visible(DLQ)] == ["id-0"]
    assert delivered_ids(coordinator) == {"id-1": 1}
    assert again.slot_files() == 0


def test_a_cancel_of_a_message_learned_delivered_is_too_late(
    tmp_path: Path, coordinator: FakeCoordinator, clock: FakeClock
):
    first = Process(tmp_path, coordinator, clock)
    first.hold(0, 0)
    again = _killed_after_commit_and_restarted(first, tmp_path)
    assert again.wheel.cancel("id-0", clock.ms() + 60_000) == "too_late"


def test_what_was_learned_and_has_not_come_up_yet_is_named_again_until_it_does(
    tmp_path: Path, coordinator: FakeCoordinator, clock: FakeClock
):
    """A restart learns two records delivered, but their slot is not loaded yet when
    the next transaction commits (a burst loading under the memory cap): that
    transaction names them too, or a second kill would send them again."""
    first = Process(tmp_path, coordinator, clock)
    first.hold(0, 0)
    first.hold(1, 0)
    first.killed_after_commit()

    second = Process(tmp_path, coordinator, clock)  # its slot is left unloaded
    second.hold(7, 0, partition=1)
    second.killed_after_commit()
    assert second.delivery.known == 2
    assert decode_sent(sent_records(coordinator)[-1].value) == {
        (0, clock.ms() // 1000): {0, 1},
        (1, clock.ms() // 1000): {7},
    }

    third = Process(tmp_path, coordinator, clock)
    third.load()
    third.step()
    assert delivered_ids(coordinator) == {"id-0": 1, "id-1": 1, "id-7": 1}
    assert third.slot_files() == 0
    assert third.delivery.known == 0  # each came up once, and is carried no more


def test_the_end_is_not_noted_while_learned_records_are_still_carried(
    tmp_path: Path, coordinator: FakeCoordinator, clock: FakeClock
):
    first = Process(tmp_path, coordinator, clock)
    first.hold(0, 0)
    first.killed_after_commit()
    second = Process(tmp_path, coordinator, clock)  # slot 0 left unloaded: 0 is carried
    clock.advance(NOTE_EVERY_S)
    second.hold(7, 0, partition=1)
    second.step()
    assert read_position(tmp_path / "timers.delivered") is None
    second.die()
    third = Process(tmp_path, coordinator, clock)
    third.load()
    third.step()
    assert delivered_ids(coordinator) == {"id-0": 1, "id-7": 1}


def test_a_fence_surfacing_as_a_system_error_from_flush_replaces_the_producer(
    tmp_path: Path, coordinator: FakeCoordinator, clock: FakeClock
):
    """A producer fenced while its delivery callbacks run can surface the fence later,
    as confluent-kafka's `SystemError` from `flush` with the `KafkaException` as its
    cause: it is the fence all the same (the producer is replaced, and what it sent
    goes again once), not an unexpected error of the loop."""
    process = Process(tmp_path, coordinator, clock)
    for offset in range(3):
        process.hold(offset, 0)
    first = process.producer
    real_flush = first.flush

    def fenced_flush(timeout: float = -1) -> int:
        first.flush = real_flush  # type: ignore[method-assign]
        fence = KafkaException(KafkaError(KafkaError._FENCED, fatal=True))
        raise SystemError("<method 'append' of 'list' objects> returned a result") from fence

    first.flush = fenced_flush  # type: ignore[method-assign]
    process.step()
    assert len(process.producers) == 2
    process.step(2)
    assert delivered_ids(coordinator) == {f"id-{o}": 1 for o in range(3)}
    assert process.fatal == []
