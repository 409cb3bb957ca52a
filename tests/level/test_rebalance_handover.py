"""Exactly-once across rebalances: the hand-over of a revoked or lost partition, on fakes.

The rule every test here is held to (`FakeProducer._check_ownership`, checked after each
test by `tests/level/conftest.py`): a transaction holds records and offsets of a
partition only if they were read during its current assignment. Each test drives one
path by which the forwarder used to break it:

1. a fatal error during the hand-over skipped forgetting the partition, and the records
   put back by the producer's replacement could go out before the consumer dropped them;
2. the hand-over gave up after a wait, and the revoke callback returned with the
   request still queued, to be committed later;
3. records taken under one assignment could be put back into the queue of the next;
4. a commit that timed out was aborted, which librdkafka refuses while the commit goes
   on, and the interval was sent again;
5. an unexpected exception in the hand-over dropped the partition without ending the
   open transaction, whose records then committed without their offsets;
6. a new owner left its start to librdkafka's own fetch of the committed offsets, which
   could start the partition from the beginning when a rebalance came in while a dead
   member's open transaction kept those offsets unstable (the 67 duplicates of group
   churn: one partition forwarded again from offset 0); and a re-seek after a failed
   transaction started each partition at this group's committed offset alone, not by
   the start's rule, so a partition idle since a change of worker layout went back to
   its beginning (issue 47).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException

from delayservice.forward import handovers
from delayservice.forward import transaction as transaction_module
from delayservice.level import start_offsets as start_offsets_module
from delayservice.level.partition_group import PartitionGroup
from tests.level import fakes
from tests.level.fakes import (
    LEVEL_TOPIC,
    FakeClock,
    FakeProducer,
    LevelRig,
    make_level_rig,
    message,
)
from tests.level.test_consumer_loop import append, forward, step, subscribed


def exactly_once_rig(clock: FakeClock) -> tuple[LevelRig, FakeProducer]:
    """A rig whose failed producer is replaced by a second one, checked the same way."""
    rig = subscribed(make_level_rig(clock=clock, exactly_once=True))
    second = FakeProducer(dict(rig.producer.topics), clock, rig.producer.config)
    second.owner = rig.consumer
    fakes.PRODUCERS.append(second)
    rig.forwarder.rebuild.make = lambda: second
    return rig, second


def run(rig: LevelRig, passes: int = 3) -> None:
    for _ in range(passes):
        step(rig)
        forward(rig, commit=True)
        step(rig)


def seen(*producers: FakeProducer) -> list[str]:
    """What a read_committed reader of the target sees, through every producer."""
    return [s.delay_id or "" for p in producers for s in p.visible(fakes.TARGET)]


def violations(*producers: FakeProducer) -> list[str]:
    return [v for p in producers for v in p.violations]


def two_partitions_in_a_transaction(clock: FakeClock) -> LevelRig:
    """Records of partitions 0 (two) and 1 (one), sent inside the open transaction."""
    rig = subscribed(make_level_rig(clock=clock, exactly_once=True))
    rig.consumer.queue_rebalance("assign", 0, 1)
    append(rig, 0, 2)
    append(rig, 1, 1)
    step(rig)
    forward(rig)
    return rig


def with_the_forwarder_running_first(rig: LevelRig) -> None:
    """The forwarder thread gets the GIL between the end of a hand-over and the consumer
    thread's own clean-up: one forwarder pass runs right after `handover` returns."""
    original = rig.forwarder.handover

    def handover(partitions: set[int], *, commit: bool) -> dict[int, int] | None:
        result = original(partitions, commit=commit)
        rig.forwarder.step(commit=True)
        return result

    rig.forwarder.handover = handover  # type: ignore[method-assign]


def test_1_a_fatal_error_during_the_hand_over_still_forgets_the_partition(clock):
    rig, second = exactly_once_rig(clock)
    with_the_forwarder_running_first(rig)
    rig.consumer.queue_rebalance("assign", 0, 1)
    append(rig, 0, 3)
    append(rig, 1, 2)
    step(rig)
    forward(rig)  # sent, inside the open transaction
    rig.producer.commit_txn_raises = KafkaException(
        KafkaError(KafkaError.INVALID_TXN_STATE, "invalid state", fatal=True)
    )
    rig.consumer.queue_rebalance("revoke", 0)
    step(rig)
    assert rig.forwarder.rebuild.producer is second
    run(rig)
    assert violations(rig.producer, second) == []
    assert not any(i.startswith("id-0-") for i in seen(rig.producer, second))
    assert sorted(seen(rig.producer, second)) == ["id-1-0", "id-1-1"]
    assert rig.fatal == []


def test_2_the_hand_over_waits_for_the_forwarder_however_long_it_takes(clock, monkeypatch):
    """A forwarder thread busy elsewhere: the revoke callback does not return before
    the forwarder has served it, and what it then commits is still owned."""
    monkeypatch.setattr(handovers, "HANDOVER_WAIT_S", 0.1)
    rig = two_partitions_in_a_transaction(clock)
    busy = threading.Event()
    rig.forwarder._thread = threading.Thread(target=busy.wait, daemon=True)
    rig.forwarder._thread.start()  # alive, not serving: a forwarder stuck in a long call
    rig.consumer.queue_rebalance("revoke", 0)
    consumer = threading.Thread(target=step, args=(rig,), daemon=True)
    consumer.start()
    consumer.join(0.6)  # six times the old give-up time
    still_waiting = consumer.is_alive()
    rig.forwarder.handovers.serve()  # the forwarder comes back to it
    consumer.join(5)
    busy.set()
    assert still_waiting, "the revoke callback returned before the hand-over"
    assert not consumer.is_alive()
    run(rig)
    assert violations(rig.producer) == []
    assert sorted(seen(rig.producer)) == ["id-0-0", "id-0-1", "id-1-0"]  # 0's went before


def test_3_records_taken_under_an_earlier_assignment_never_return_to_the_queue():
    group = PartitionGroup([(LEVEL_TOPIC, 1000, 0)], lambda: 10.0)
    tp = (LEVEL_TOPIC, 0)
    group.assign(tp)
    earlier = group.incarnation(tp)
    records = [message(0, o, 1_000, headers=None) for o in range(3)]
    group.add(tp, records, 300, 5_000)
    ((_, taken),) = group.take(10)
    group.drop({tp})  # revoked
    group.assign(tp)  # and assigned again: read anew from the last commit
    group.put_back(tp, taken, incarnation=earlier)
    assert group.total_buffered == 0
    assert group.incarnation(tp) != earlier
    group.put_back(tp, taken, incarnation=group.incarnation(tp))  # the current one: back
    assert group.total_buffered == 3


def test_3_a_forwarder_never_puts_back_what_a_reassigned_partition_had(clock):
    rig = subscribed(make_level_rig(clock=clock, exactly_once=True))
    tp = (LEVEL_TOPIC, 0)
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 2)
    step(rig)
    forward(rig)  # 0@0 and 0@1 inside the open transaction
    taken_under = rig.forwarder.interval.taken_from[tp]
    rig.group.drop({tp})  # as if revoked and assigned again behind the forwarder's back
    rig.group.assign(tp)
    rig.forwarder.checkpoint.txn.abort()
    rig.forwarder.interval.requeue({})
    assert rig.group.incarnation(tp) != taken_under
    assert rig.group.total_buffered == 0


def test_4_a_commit_that_times_out_is_retried_as_a_commit_never_aborted(clock):
    rig, second = exactly_once_rig(clock)
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 3)
    step(rig)
    rig.producer.commit_timeouts = 3  # goes through on the fourth call
    forward(rig, commit=True)
    run(rig)
    assert rig.forwarder.rebuild.producer is rig.producer  # not replaced
    assert rig.producer.aborted == []
    assert seen(rig.producer, second) == ["id-0-0", "id-0-1", "id-0-2"]
    assert rig.producer.committed_txns[-1][1] == [((LEVEL_TOPIC, 0), 3)]


def test_4_a_commit_whose_outcome_stays_unknown_is_fenced_and_read_again(clock):
    """It kept timing out while it went through in the background: the new producer
    fences it, nothing is sent again from memory, and the re-read starts after it."""
    rig, second = exactly_once_rig(clock)
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 3)
    step(rig)
    rig.producer.commit_timeouts = transaction_module.COMMIT_ATTEMPTS
    forward(rig, commit=True)
    assert rig.forwarder.rebuild.producer is second
    assert rig.forwarder.inbox.reseek_wanted()
    append(rig, 0, 1)
    run(rig)
    assert not rig.forwarder.inbox.reseek_wanted()
    assert (0, 3) in rig.consumer.seeks  # read again from the committed offset
    assert seen(rig.producer, second) == ["id-0-0", "id-0-1", "id-0-2", "id-0-3"]
    assert violations(rig.producer, second) == []


def test_a_re_seek_asked_for_during_a_revoke_waits_for_the_next_iteration(clock):
    """A hand-over that ends in an unknown outcome asks for a re-seek; inside the
    rebalance callback its committed() and seek() would wait on the broker the
    rebalance is waiting on, so the callback only leaves the request."""
    rig, second = exactly_once_rig(clock)
    rig.consumer.queue_rebalance("assign", 0, 1)
    append(rig, 0, 2)
    append(rig, 1, 1)
    step(rig)
    forward(rig)
    rig.producer.commit_timeouts = transaction_module.COMMIT_ATTEMPTS
    rig.consumer.queue_rebalance("revoke", 0)
    step(rig)  # the revoke's commit point cannot say what it did: the producer goes
    assert rig.forwarder.rebuild.producer is second
    assert rig.loop.owned() == [1]
    assert rig.forwarder.inbox.reseek_wanted()
    assert rig.consumer.seeks == []  # nothing sought from inside the callback
    step(rig)
    assert not rig.forwarder.inbox.reseek_wanted()
    assert [tp for tp, _ in rig.consumer.seeks] == [1]
    run(rig)
    assert violations(rig.producer, second) == []


def test_an_abort_that_runs_out_of_time_is_resumed_on_the_same_producer(clock):
    """librdkafka's abort goes on after its timeout ("retry call to resume"); a broker
    frozen past one call must not cost the producer, its init and a re-read."""
    rig, second = exactly_once_rig(clock)
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 3)
    step(rig)
    rig.producer.hold_reports = True  # the flush before commit times out: abort
    rig.producer.abort_timeouts = transaction_module.ABORT_ATTEMPTS - 1
    forward(rig, commit=True)
    assert rig.forwarder.rebuild.producer is rig.producer  # not replaced
    assert not rig.forwarder.inbox.reseek_wanted()
    assert rig.producer.abort_timeouts == 0
    assert len(rig.producer.aborted) == 3
    rig.producer.hold_reports = False
    run(rig)
    assert seen(rig.producer, second) == ["id-0-0", "id-0-1", "id-0-2"]
    assert violations(rig.producer, second) == []


def test_an_abort_that_keeps_running_out_of_time_replaces_the_producer(clock):
    rig, second = exactly_once_rig(clock)
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 3)
    step(rig)
    rig.producer.hold_reports = True
    rig.producer.abort_timeouts = transaction_module.ABORT_ATTEMPTS
    forward(rig, commit=True)
    assert rig.producer.abort_timeouts == 0  # every attempt was made
    assert rig.forwarder.rebuild.producer is second
    assert rig.forwarder.inbox.reseek_wanted()  # its outcome is unknown: read again
    run(rig)
    assert seen(rig.producer, second) == ["id-0-0", "id-0-1", "id-0-2"]
    assert violations(rig.producer, second) == []


def test_5_an_unexpected_error_in_the_hand_over_ends_the_transaction_first(clock):
    rig = two_partitions_in_a_transaction(clock)
    original = rig.forwarder.checkpoint.commit_point
    calls = []

    def commit_point() -> bool:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in the commit point")
        return original()

    rig.forwarder.checkpoint.commit_point = commit_point  # type: ignore[method-assign]
    rig.consumer.queue_rebalance("revoke", 0)
    step(rig)
    assert rig.loop.owned() == [1]
    run(rig)
    assert violations(rig.producer) == []
    assert seen(rig.producer) == ["id-1-0"]


def test_a_group_error_at_commit_reads_again_instead_of_sending_from_memory(clock):
    rig = subscribed(make_level_rig(clock=clock, exactly_once=True))
    rig.consumer.queue_rebalance("assign", 0)
    append(rig, 0, 2)
    step(rig)
    rig.producer.send_offsets_raises = KafkaException(
        KafkaError(KafkaError.ILLEGAL_GENERATION, "generation", txn_requires_abort=True)
    )
    forward(rig, commit=True)
    assert rig.forwarder.inbox.reseek_wanted()
    rig.producer.send_offsets_raises = None
    run(rig)
    assert (0, OFFSET_BEGINNING) in rig.consumer.seeks  # nothing committed yet
    assert seen(rig.producer) == ["id-0-0", "id-0-1"]
    assert violations(rig.producer) == []


@pytest.mark.parametrize("exactly_once", [True, False])
def test_6_a_new_owner_starts_at_the_committed_offset_whatever_the_clients_fetch_says(
    clock, exactly_once
):
    rig = subscribed(make_level_rig(clock=clock, exactly_once=exactly_once))
    rig.consumer.committed_tps[(LEVEL_TOPIC, 0)] = 3  # where the previous owner's commit left it
    rig.consumer.fetch_loses_offsets = True
    append(rig, 0, 5)
    rig.consumer.queue_rebalance("assign", 0)
    run(rig)
    assert rig.consumer.explicit_starts == [(0, 3)]
    assert seen(rig.producer) == ["id-0-3", "id-0-4"]


def test_6_a_partition_never_committed_starts_at_the_beginning(clock):
    rig = subscribed(make_level_rig(clock=clock, exactly_once=True))
    append(rig, 0, 2)
    rig.consumer.queue_rebalance("assign", 0)
    run(rig)
    assert rig.consumer.explicit_starts == [(0, OFFSET_BEGINNING)]
    assert seen(rig.producer) == ["id-0-0", "id-0-1"]


def test_6_an_assignment_waits_while_a_dead_members_transaction_holds_the_offsets(
    clock, monkeypatch
):
    monkeypatch.setattr(start_offsets_module, "STABLE_RETRY_S", 0.0)
    rig = subscribed(make_level_rig(clock=clock, exactly_once=True))
    rig.consumer.committed_tps[(LEVEL_TOPIC, 0)] = 2
    rig.consumer.fetch_loses_offsets = True
    rig.consumer.unstable_answers = 3  # until the broker aborts that transaction
    append(rig, 0, 4)
    rig.consumer.queue_rebalance("assign", 0)
    run(rig)
    assert rig.consumer.committed_calls >= 4
    assert seen(rig.producer) == ["id-0-2", "id-0-3"]


@pytest.mark.parametrize("exactly_once", [True, False])
def test_6_a_partition_starts_at_the_later_of_its_groups_offset_and_the_other_layouts(
    clock, exactly_once, monkeypatch
):
    """After a change of worker layout the other layout's group is the one that moved
    on (and on the way back this group's offsets are the old ones): each partition
    starts at the later of the two, asked again while the other's are unstable."""
    monkeypatch.setattr(start_offsets_module, "STABLE_RETRY_S", 0.0)
    rig = subscribed(make_level_rig(clock=clock, exactly_once=exactly_once))
    answers: list[dict[tuple[str, int], int] | None] = [
        None,  # a killed member's transaction still holds them
        None,
        {(LEVEL_TOPIC, 0): 3, (LEVEL_TOPIC, 1): 1},
    ]
    asked: list[list[tuple[str, int]]] = []

    def other_layout(tps: list[tuple[str, int]]) -> dict[tuple[str, int], int] | None:
        asked.append(tps)
        return answers.pop(0)

    rig.loop._fallback = other_layout
    rig.consumer.committed_tps[(LEVEL_TOPIC, 1)] = 2  # this group got further here
    append(rig, 0, 5)
    append(rig, 1, 4)
    rig.consumer.queue_rebalance("assign", 0, 1)
    run(rig)
    assert len(asked) == 3
    assert sorted(rig.consumer.explicit_starts) == [(0, 3), (1, 2)]
    assert sorted(seen(rig.producer)) == ["id-0-3", "id-0-4", "id-1-2", "id-1-3"]


def test_6_a_fallback_that_raises_is_asked_again_and_the_partitions_are_still_assigned(
    clock, monkeypatch
):
    """After a broker restart the admin call for the other layout's offsets can time out
    (a bare TimeoutError, not a KafkaException): the assign callback asks again instead
    of failing, which left the member without its partitions."""
    monkeypatch.setattr(start_offsets_module, "STABLE_RETRY_S", 0.0)
    rig = subscribed(make_level_rig(clock=clock, exactly_once=True))
    calls = {"n": 0}

    def flaky(tps: list[tuple[str, int]]) -> dict[tuple[str, int], int] | None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise TimeoutError
        return {}

    rig.loop._fallback = flaky
    append(rig, 0, 2)
    rig.consumer.queue_rebalance("assign", 0)
    run(rig)
    assert calls["n"] == 2
    assert rig.loop.owned() == [0]
    assert seen(rig.producer) == ["id-0-0", "id-0-1"]


def group_error_at_commit(rig: LevelRig, _second: FakeProducer) -> None:
    rig.producer.send_offsets_raises = KafkaException(
        KafkaError(KafkaError.ILLEGAL_GENERATION, "generation", txn_requires_abort=True)
    )
    forward(rig, commit=True)
    rig.producer.send_offsets_raises = None


def unknown_outcome_at_commit(rig: LevelRig, second: FakeProducer) -> None:
    rig.producer.commit_timeouts = transaction_module.COMMIT_ATTEMPTS
    forward(rig, commit=True)
    assert rig.forwarder.rebuild.producer is second  # rebuilt


@pytest.mark.parametrize("reset", [group_error_at_commit, unknown_outcome_at_commit])
def test_6_a_re_seek_starts_where_a_start_would_the_other_layouts_offset_included(clock, reset):
    """Issue 47, finding 2: after a change of worker layout a partition whose progress
    is only in the other layout's group (idle since, so never committed in this one)
    was sought back to its beginning by a re-seek, and every record the old layout had
    forwarded went out again. A re-seek starts each partition by the start's rule."""
    rig, second = exactly_once_rig(clock)
    asked: list[list[tuple[str, int]]] = []

    def other_layout(tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        asked.append(tps)
        return {tp: 5 for tp in tps if tp == (LEVEL_TOPIC, 0)}

    rig.loop._fallback = other_layout
    append(rig, 0, 5)  # forwarded and committed by the other layout's group
    rig.consumer.queue_rebalance("assign", 0, 1)
    run(rig)
    assert rig.consumer.explicit_starts == [(0, 5), (1, OFFSET_BEGINNING)]
    append(rig, 1, 2)
    step(rig)
    reset(rig, second)
    assert rig.forwarder.inbox.reseek_wanted()
    run(rig)
    assert not rig.forwarder.inbox.reseek_wanted()
    assert seen(rig.producer, second) == ["id-1-0", "id-1-1"]  # nothing of 0-4 again
    assert (0, 5) in rig.consumer.seeks
    assert len(asked) == 2  # at the assignment and at the re-seek
    assert violations(rig.producer, second) == []


def _a_re_seek_wanted(rig: LevelRig, second: FakeProducer, first_records: int) -> None:
    """Partitions 0 and 1 assigned and read, then a transaction refused for its group
    generation: the forwarder wants them read again from their committed offsets."""
    append(rig, 0, first_records)
    rig.consumer.queue_rebalance("assign", 0, 1)
    run(rig)
    append(rig, 1, 2)
    step(rig)
    group_error_at_commit(rig, second)
    assert rig.forwarder.inbox.reseek_wanted()


class _AskedForever(BaseException):
    """Not an `Exception`, so no loop of the worker takes it for a client error."""


@contextlib.contextmanager
def _asked_at_most_50_times(rig: LevelRig, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An ask for committed offsets that never ends fails the test instead of hanging it:
    what the asking did before it was bounded."""
    calls = rig.consumer.committed_calls
    answer = rig.consumer.committed

    def bounded(partitions: list[object], timeout: float = -1) -> object:
        if rig.consumer.committed_calls > calls + 50:
            raise _AskedForever
        return answer(partitions, timeout)

    monkeypatch.setattr(rig.consumer, "committed", bounded)
    try:
        yield
    finally:
        monkeypatch.setattr(rig.consumer, "committed", answer)


def test_6_a_re_seek_on_a_client_gone_fatal_leaves_the_start_to_its_replacement(clock, monkeypatch):
    """A client fenced while the re-seek asks for committed offsets never says so to
    `committed()`, which times out for as long as it is asked (row 18 exactly-once,
    docs/faults.md); the fatal error waits in the queue the asking thread does not
    serve. The wait asks the client itself (`kafka.consumer_fatal`): it is marked
    failed and nothing more is read from it; the consumer that replaces it starts
    each partition by the same rule, the other layout's offset included."""
    monkeypatch.setattr(start_offsets_module, "STABLE_RETRY_S", 0.0)
    rig, second = exactly_once_rig(clock)
    rig.loop._fallback = lambda tps: {tp: 5 for tp in tps if tp == (LEVEL_TOPIC, 0)}
    _a_re_seek_wanted(rig, second, 5)  # 0's forwarded and committed by the other layout
    rig.consumer.go_fatal()
    calls, reads = rig.consumer.committed_calls, rig.consumer.consume_calls
    with _asked_at_most_50_times(rig, monkeypatch):
        step(rig)
    assert "Static consumer fenced" not in (rig.loop.keeper.failed or "")  # not said yet
    assert "went fatal while its committed offsets were asked" in (rig.loop.keeper.failed or "")
    assert rig.consumer.committed_calls == calls + 1  # asked once, not for ever
    assert rig.consumer.consume_calls == reads  # nothing read from a client gone fatal
    assert rig.loop._replace_client(rig.loop.keeper)
    rig.consumer.queue_rebalance("assign", 0, 1)
    run(rig)
    assert seen(rig.producer, second) == ["id-1-0", "id-1-1"]
    assert rig.consumer.explicit_starts[-2:] == [(0, 5), (1, OFFSET_BEGINNING)]
    assert violations(rig.producer, second) == []


def test_6_a_re_seek_whose_client_never_answers_hands_it_over_to_a_new_one(clock, monkeypatch):
    """A re-seek serves no queue while it asks, so a client that lost its coordinator
    and never says why is replaced once the asking has lasted `RESEEK_ASK_LIMIT_S`
    (row 18 exactly-once, docs/faults.md); the new client's assignment starts each
    partition by the same rule, and the re-seek has nothing left to do."""
    monkeypatch.setattr(start_offsets_module, "STABLE_RETRY_S", 0.0)
    monkeypatch.setattr(start_offsets_module, "RESEEK_ASK_LIMIT_S", 0.0)
    rig, second = exactly_once_rig(clock)
    _a_re_seek_wanted(rig, second, 3)
    rig.consumer.unstable_answers = 1_000  # every ask times out
    calls, reads = rig.consumer.committed_calls, rig.consumer.consume_calls
    step(rig)
    assert "committed offsets not given for 0 s on a re-seek" in (rig.loop.keeper.failed or "")
    assert rig.consumer.committed_calls == calls + 1
    assert rig.consumer.consume_calls == reads
    rig.consumer.unstable_answers = 0  # the new client is answered
    assert rig.loop._replace_client(rig.loop.keeper)
    rig.consumer.queue_rebalance("assign", 0, 1)
    run(rig)
    assert not rig.forwarder.inbox.reseek_wanted()
    assert set(seen(rig.producer, second)) >= {"id-1-0", "id-1-1"}
    assert violations(rig.producer, second) == []


def test_6_an_assignment_whose_client_never_answers_hands_it_over_to_a_new_one(clock, monkeypatch):
    """The assign callback asked for committed offsets for as long as the client lived:
    one that lost its coordinator (row 18 exactly-once, docs/faults.md) left the
    partitions it was given unread. It is replaced once the asking has lasted
    `ASSIGN_ASK_LIMIT_S`; nothing is read from it, and its successor's assignment
    starts the partitions."""
    monkeypatch.setattr(start_offsets_module, "STABLE_RETRY_S", 0.0)
    monkeypatch.setattr(start_offsets_module, "ASSIGN_ASK_LIMIT_S", 0.0)
    rig, second = exactly_once_rig(clock)
    append(rig, 0, 3)
    rig.consumer.unstable_answers = 1_000  # every ask times out
    calls = rig.consumer.committed_calls
    rig.consumer.queue_rebalance("assign", 0)
    with _asked_at_most_50_times(rig, monkeypatch):
        step(rig)
    failed = rig.loop.keeper.failed or ""
    assert "committed offsets not given for 0 s on an assignment" in failed
    assert rig.consumer.committed_calls == calls + 1
    assert rig.loop.owned() == []  # nothing assigned from a client about to go
    rig.consumer.unstable_answers = 0  # the new client is answered
    assert rig.loop._replace_client(rig.loop.keeper)
    rig.consumer.queue_rebalance("assign", 0)
    run(rig)
    assert rig.consumer.explicit_starts[-1:] == [(0, OFFSET_BEGINNING)]
    assert seen(rig.producer, second) == ["id-0-0", "id-0-1", "id-0-2"]
    assert violations(rig.producer, second) == []


def test_6_a_bare_kafka_error_while_fetching_the_start_asks_again(clock, monkeypatch):
    """`committed()` leaves the `KafkaError` itself as the exception once (see
    `kafka.client_errors`), inside the assign callback: the start is asked for again,
    and the partition is assigned and read, not left out of the assignment."""
    monkeypatch.setattr(start_offsets_module, "STABLE_RETRY_S", 0.0)
    rig, second = exactly_once_rig(clock)
    answer = rig.consumer.committed
    raised: list[bool] = []

    def bare_once(partitions: list[object], timeout: float = -1) -> object:
        if not raised:
            raised.append(True)
            fakes.raise_bare_kafka_error(KafkaError(KafkaError._TRANSPORT, "raised as it is"))
        return answer(partitions, timeout)

    monkeypatch.setattr(rig.consumer, "committed", bare_once)
    append(rig, 0, 3)
    rig.consumer.queue_rebalance("assign", 0)
    run(rig)
    assert raised == [True]
    assert rig.consumer.explicit_starts[-1:] == [(0, OFFSET_BEGINNING)]
    assert seen(rig.producer, second) == ["id-0-0", "id-0-1", "id-0-2"]
    assert violations(rig.producer, second) == []


@pytest.mark.parametrize("ends", ["revoke", "lost"])
def test_an_abort_s_purge_reports_cost_the_next_transaction_nothing(clock, ends):
    """librdkafka's abort purges what is still queued and serves a `_PURGE_QUEUE` report
    for each record (tests/kafka/test_transaction_purge.py). Those records go again from
    the queues anyway: their reports are no failure of the next transaction, which
    must commit at its first commit point, with no second abort, no backoff and no
    forward error counted."""
    rig = subscribed(make_level_rig(clock=clock, exactly_once=True))
    rig.consumer.queue_rebalance("assign", 0, 1)
    append(rig, 0, 2)
    append(rig, 1, 1)
    step(rig)
    rig.producer.hold_reports = True  # still queued in librdkafka at the abort
    forward(rig)
    rig.consumer.queue_rebalance(ends, 0)
    step(rig)
    assert rig.loop.owned() == [1]
    assert len(rig.producer.aborted) == 3
    rig.producer.hold_reports = False
    forward(rig)
    forward(rig, commit=True)
    assert seen(rig.producer) == ["id-1-0"]
    assert len(rig.producer.aborted) == 3
    assert rig.metric("delayservice_forward_errors_total", error="_PURGE_QUEUE") == 0
    assert violations(rig.producer) == []
