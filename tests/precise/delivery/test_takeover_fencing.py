"""Two copies, exactly-once, on fakes: the owner and its replica forward a partition
under one transactional id, so whichever inits last fences the other, and learns what
the other committed before it sends. A read_committed reader of the target sees each
record once: when the replica fences a frozen owner, when the owner comes back and
fences the replica, and when a takeover's commit has an unknown outcome."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from delayservice.forward.send_errors import SendLaterError
from delayservice.kafka.log_levels import ExpectedFences
from delayservice.precise.delivery.sent_records import decode_sent_record, sent_key
from delayservice.precise.delivery.takeover import CATCH_UP_WAIT_S
from delayservice.precise.wheel.slot_taking import NOT_READY_RETRY_S
from tests.level.fakes import TARGET, FakeClock, raise_bare_kafka_error, wait_for
from tests.precise.eos_rig import delivered_ids, sent_records
from tests.precise.takeover_rig import TAKEOVER_S, Holder, hold_both, transactional_id
from tests.precise.txn_fakes import FakeCoordinator, FencingProducer


@pytest.fixture
def pair(
    tmp_path: Path, coordinator: FakeCoordinator, clock: FakeClock
) -> Iterator[tuple[Holder, Holder]]:
    owner = Holder(tmp_path / "owner", coordinator, clock, 0)
    replica = Holder(tmp_path / "replica", coordinator, clock, 1)
    yield owner, replica
    for holder in (owner, replica):
        holder.stop()


def once_each(coordinator: FakeCoordinator, offsets: range) -> dict[str, int]:
    return {f"id-{o}": 1 for o in offsets}


def aborted_ids(producer: FencingProducer) -> list[str]:
    return [s.delay_id or "" for s in producer.aborted if s.topic == TARGET]


def frozen_owner_taken_over(owner: Holder, replica: Holder, clock: FakeClock) -> None:
    """The owner commits 0-2, sends 3-5 in a transaction and freezes before it commits;
    past the takeover delay the replica's copies come due."""
    now = clock.ms()
    hold_both([owner, replica], range(3), now + 1000)
    hold_both([owner, replica], range(3, 6), now + 2000)
    clock.advance(1)
    owner.load()
    owner.forwarder.step(commit=True)
    clock.advance(0.999)
    owner.forwarder.step(commit=True)  # a commit point just before 3-5 fall due
    clock.advance(0.001)
    owner.forwarder.step()  # 3-5 sent, the transaction open: the owner freezes here
    assert owner.producers_of(0)[-1].txn_open
    clock.advance(TAKEOVER_S + 0.5)
    replica.load()
    replica.takeover_forwarder.step(commit=True)


def test_the_replica_taking_over_fences_the_frozen_owner_and_sends_only_what_it_had_not(
    pair: tuple[Holder, Holder], coordinator: FakeCoordinator, clock: FakeClock
):
    owner, replica = pair
    frozen_owner_taken_over(owner, replica, clock)
    # The replica's init under the owner's id ended the owner's open transaction.
    [taking_over] = replica.producers_of(0)
    assert owner.producers_of(0)[0].fatal_error is not None  # fenced
    assert sorted(aborted_ids(owner.producers_of(0)[0])) == ["id-3", "id-4", "id-5"]
    assert delivered_ids(coordinator) == once_each(coordinator, range(6))
    # What it delivered is named under the owner's id, by the replica.
    [record] = [r for r in sent_records(coordinator) if r.key == sent_key(0, 1)]
    decoded = decode_sent_record(record.value)
    assert decoded is not None
    assert (decoded.member, decoded.writer) == (0, 1)
    assert set().union(*decoded.offsets.values()) == {3, 4, 5}
    assert replica.outcomes.counts["took_over"] == 3
    assert replica.outcomes.counts["cleaned"] == 3  # 0-2: the owner's record said so
    assert taking_over.fatal_error is None
    assert replica.fatal == []
    assert owner.fatal == []


def test_the_owner_back_fences_the_replica_learns_what_it_sent_and_sends_the_rest(
    pair: tuple[Holder, Holder], coordinator: FakeCoordinator, clock: FakeClock
):
    owner, replica = pair
    frozen_owner_taken_over(owner, replica, clock)
    # 6-8 come due on the replica too, and go into a transaction it has not committed.
    now = clock.ms()
    hold_both([owner, replica], range(6, 9), now - int(TAKEOVER_S * 1000) - 500)
    replica.load()
    replica.takeover_forwarder.step()
    assert replica.producers_of(0)[0].txn_open
    # The owner thaws: its commit is refused (fenced), its new producer fences the
    # replica (whose open transaction is aborted) and learns what the replica sent.
    owner.forwarder.step(commit=True)
    owner.load()
    owner.forwarder.step(commit=True)
    assert len(owner.producers_of(0)) == 2
    assert sorted(aborted_ids(replica.producers_of(0)[0])) == ["id-6", "id-7", "id-8"]
    assert delivered_ids(coordinator) == once_each(coordinator, range(9))
    # The replica, fenced, holds its copies; after that the owner's word settles them.
    replica.takeover_forwarder.step(commit=True)
    assert len(replica.producers_of(0)) == 2
    clock.advance(TAKEOVER_S + 0.5)
    wait_for(lambda: replica.progress.read_past(len(sent_records(coordinator))), "progress read")
    replica.takeover_forwarder.step(commit=True)
    replica.load()
    replica.takeover_forwarder.step(commit=True)
    assert delivered_ids(coordinator) == once_each(coordinator, range(9))
    assert len(replica.producers_of(0)) == 2  # it did not take over again
    assert replica.wheel.takeover_buffer is not None
    assert len(replica.wheel.takeover_buffer) == 0
    owner.load()
    replica.load()
    assert owner.slot_files() == 0
    assert replica.slot_files() == 0
    assert replica.fatal == []
    assert owner.fatal == []


@pytest.mark.parametrize("completed", [True, False], ids=["committed", "aborted"])
def test_a_takeover_commit_whose_outcome_is_unknown_is_learned_never_sent_twice(
    pair: tuple[Holder, Holder], coordinator: FakeCoordinator, clock: FakeClock, completed: bool
):
    """The replica's commit under the owner's id keeps timing out: its new producer's
    init ends that transaction either way, and the done topic then says which copies
    go again; the owner, back, learns the same."""
    coordinator.in_flight_completes = completed
    owner, replica = pair
    now = clock.ms()
    hold_both([owner, replica], range(4), now + 1000)
    clock.advance(1 + TAKEOVER_S + 0.5)  # the owner never came to them
    replica.load()
    replica.producers_of(0)[0].commit_timeouts = 1_000
    replica.takeover_forwarder.step(commit=True)  # init under the owner's id, send, commit
    assert len(replica.producers_of(0)) == 2
    assert replica.copies_log.learned_records == (4 if completed else 0)
    replica.takeover_forwarder.step(commit=True)
    replica.takeover_forwarder.step(commit=True)
    assert delivered_ids(coordinator) == once_each(coordinator, range(4))
    owner.load()
    owner.forwarder.step(commit=True)  # back: fences the replica, learns, sends nothing
    owner.forwarder.step(commit=True)
    assert delivered_ids(coordinator) == once_each(coordinator, range(4))
    assert owner.outcomes.counts["cleaned"] == 4
    assert replica.fatal == []
    assert owner.fatal == []


def test_a_live_owner_is_never_fenced_by_copies_it_covered(
    pair: tuple[Holder, Holder], coordinator: FakeCoordinator, clock: FakeClock
):
    """Every copy of a live owner's records comes due on the replica: none may take
    the owner's id, or each would abort the owner's open transaction."""
    owner, replica = pair
    now = clock.ms()
    for second in range(5):
        hold_both([owner, replica], range(second * 10, second * 10 + 10), now + second * 1000)
    for _ in range(5 + int(TAKEOVER_S) + 2):
        clock.advance(1)
        owner.load()
        owner.forwarder.step(commit=True)
        owner.report()
        done = len(sent_records(coordinator))
        wait_for(lambda: replica.progress.read_past(done), "progress read")  # noqa: B023
        replica.load()
        replica.takeover_forwarder.step(commit=True)
    assert delivered_ids(coordinator) == once_each(coordinator, range(50))
    assert [p.txn_inits for p in replica.producers_of(0)] == [0]
    assert coordinator.holders[transactional_id(0)] is owner.producers_of(0)[0]
    assert replica.outcomes.counts["cleaned"] == 50


@pytest.mark.parametrize("reader_back", [True, False], ids=["reader-back", "reader-late"])
def test_a_replica_behind_the_owners_word_reads_it_before_it_fences(
    pair: tuple[Holder, Holder], coordinator: FakeCoordinator, clock: FakeClock, reader_back: bool
):
    """A replica thawed after a freeze finds every copy uncovered: its progress reader
    is behind. It waits for the reader to read what was written so far before it fences
    the live owner (reader back: no fence at all); a reader back only after that wait
    costs a fence, never a duplicate."""
    owner, replica = pair
    reader = replica.progress_reader
    reader.paused.set()
    now = clock.ms()
    hold_both([owner, replica], range(5), now + 1000)
    clock.advance(1)
    owner.load()
    owner.forwarder.step(commit=True)
    owner.report()
    clock.advance(TAKEOVER_S + 0.5)
    replica.load()
    # Back within the wait, or only once the wait is over (the learn after the fence
    # waits for it as well).
    back_after = 0.3 if reader_back else CATCH_UP_WAIT_S + 0.5
    threading.Timer(back_after, reader.paused.clear).start()
    replica.takeover_forwarder.step(commit=True)
    assert delivered_ids(coordinator) == once_each(coordinator, range(5))
    inits = [p.txn_inits for p in replica.producers_of(0)]
    if reader_back:
        assert inits == [0]
        assert replica.outcomes.counts["cleaned"] == 5
    else:
        assert inits == [1]  # fenced the owner, learned, sent nothing
        assert coordinator.holders[transactional_id(0)] is replica.producers_of(0)[0]


def test_both_holders_log_librdkafkas_fence_lines_as_warnings(
    pair: tuple[Holder, Holder], clock: FakeClock
) -> None:
    """Each takeover fences one of them by design, so their producers' log lines go
    through `ExpectedFences` (tests/kafka/test_log_levels.py shows it on a real fence)."""
    owner, replica = pair
    frozen_owner_taken_over(owner, replica, clock)
    producers = owner.producers_of(0) + replica.producers_of(0)
    assert {type(p.config["logger"]) for p in producers} == {ExpectedFences}


def test_a_bare_kafka_error_from_the_takeovers_init_keeps_the_copies_it_took(
    pair: tuple[Holder, Holder],
    coordinator: FakeCoordinator,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
):
    """The replica's first init under the owner's id leaves the `KafkaError` itself as
    the exception, which `except BaseException` does not match (`kafka.client_errors`):
    the copies it took for the takeover are held again, not dropped, and go out once
    the next init works."""
    owner, replica = pair
    real_init = FencingProducer.init_transactions
    armed: list[bool] = []

    def init_transactions(self: FencingProducer, timeout: float = -1) -> None:
        if armed == [True]:
            armed.append(False)
            raise_bare_kafka_error(
                KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE, "raised as it is", retriable=True)
            )
        real_init(self, timeout)

    monkeypatch.setattr(FencingProducer, "init_transactions", init_transactions)
    now = clock.ms()
    hold_both([owner, replica], range(3), now + 1000)
    clock.advance(TAKEOVER_S + 1.5)  # the owner never forwards: its copies come due
    replica.load()
    armed.append(True)
    with pytest.raises(SendLaterError, match="raised as it is"):
        replica.takeover_forwarder.step(commit=True)
    assert armed == [True, False], "the scenario never raised from the init"
    for _ in range(3):
        clock.advance(NOT_READY_RETRY_S + 0.1)
        replica.load()
        replica.takeover_forwarder.step(commit=True)
    assert delivered_ids(coordinator) == once_each(coordinator, range(3))
    assert replica.fatal == []
