"""Cancel and reschedule of level messages on the fake level rig, under both guarantees.

The markers are filed into the worker's book by hand and the gate moved by hand (the
reader thread is tested on the real broker): what is checked here is what the forwarder
does with them. A cancel appended before its message's due time withdraws it (its
offset commits, nothing reaches the target), a reschedule re-publishes a copy to the
level that holds what is left, and each marker is answered on the outcomes topic, in the
transaction of what it did under exactly-once.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka import KafkaError

from delayservice.envelope import H_DELAY_MS, H_DUE_MS, H_MOVED_BY
from delayservice.level.level_route import LevelRoute
from delayservice.level.markers.actions import CHECK_MS, SERVE_GAP_MS
from delayservice.level.markers.search import EMPTY_GRACE_MS
from delayservice.level.markers.verdict import LevelMarker
from delayservice.markers.level_ids import level_id
from delayservice.markers.replies import CANCEL, CANCELLED, RESCHEDULE
from tests.level.fakes import (
    LEVEL,
    LEVELS,
    LONGER,
    MAX_DELAY_MS,
    OUTCOMES,
    TARGET,
    FakeClock,
    LevelRig,
    envelope_headers,
    kafka_error,
    make_level_rig,
    message,
)
from tests.level.test_consumer_loop import forward, step, subscribed

GUARANTEES = [False, True]
MARKERS = "delay_markers"


def rig_for(clock: FakeClock, exactly_once: bool, cancel_lead_ms: int = 0) -> LevelRig:
    rig = subscribed(
        make_level_rig(
            clock=clock, exactly_once=exactly_once, markers=True, cancel_lead_ms=cancel_lead_ms
        )
    )
    rig.consumer.queue_rebalance("assign", 0, 1, 2)
    step(rig)
    return rig


def send(rig: LevelRig, partition: int, offset: int, appended_ms: int) -> str:
    """A level message with an id naming its place, appended at `appended_ms`."""
    mid = level_id(LEVEL.index, partition, appended_ms)
    headers = envelope_headers(message_id=mid)
    rig.consumer.append(partition, message(partition, offset, appended_ms, headers=headers))
    return mid


def marker(
    rig: LevelRig, kind: str, mid: str, appended_ms: int, offset: int, asked: int | None = None
) -> LevelMarker:
    filed = LevelMarker(kind, mid, appended_ms, MARKERS, 0, offset, asked)
    assert rig.markers is not None
    rig.markers.book.file(filed)
    return filed


def read_through(rig: LevelRig, ms: int | None = None) -> None:
    """The reader read every marker appended before `ms` (now), and every answer."""
    assert rig.markers is not None
    gate = rig.markers.gate
    if gate.covered_from_ms is None:
        gate.start(0)
    at = rig.now_ms() if ms is None else ms
    gate.advance(at, at, gate.generation)


def cycle(rig: LevelRig, times: int = 3) -> None:
    for _ in range(times):
        step(rig)
        forward(rig, commit=True)
        step(rig)


def answers(rig: LevelRig) -> dict[bytes, dict[str, Any]]:
    """Answers a read_committed reader of the outcomes topic sees, by marker."""
    return {s.key: json.loads(s.value) for s in rig.producer.visible(OUTCOMES)}


def delivered(rig: LevelRig) -> list[str]:
    return [s.delay_id or "" for s in rig.producer.visible(TARGET)]


def committed(rig: LevelRig, partition: int) -> int | None:
    if rig.forwarder.transactional:
        out = None
        for _sent, offsets in rig.producer.committed_txns:
            for tp, offset in offsets:
                if tp == (LEVEL.topic, partition):
                    out = offset
        return out
    return rig.consumer.committed_offsets.get(partition)


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_nothing_due_after_the_markers_read_is_forwarded(clock, exactly_once):
    rig = rig_for(clock, exactly_once)
    now = clock.ms()
    mid = send(rig, 0, 0, now - LEVEL.delay_ms - 100)  # due 100 ms ago
    cycle(rig)
    assert delivered(rig) == [], "forwarded before the markers were read through its due time"
    read_through(rig, now - 200)
    cycle(rig)
    assert delivered(rig) == []
    read_through(rig)
    cycle(rig)
    assert delivered(rig) == [mid]


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_with_a_lead_a_record_waits_only_for_the_markers_before_its_due_time_less_it(
    clock, exactly_once
):
    """`cancel_lead`: a record due at D goes once every marker appended before D less
    the lead was read, so the reader's passes, ahead of the due times, never hold it. A
    cancel appended before that is honoured; one after it, if read before the forward."""
    rig = rig_for(clock, exactly_once, cancel_lead_ms=1_000)
    now = clock.ms()
    due = now - 100
    early = send(rig, 0, 0, due - LEVEL.delay_ms)
    late = send(rig, 0, 1, due - LEVEL.delay_ms + 1)
    kept = send(rig, 0, 2, due - LEVEL.delay_ms + 2)
    read_through(rig, due - 1_001)
    cycle(rig)
    assert delivered(rig) == [], "forwarded before the markers were read through D - lead"
    cancel = marker(rig, CANCEL, early, due - 1_500, offset=0)
    read_through(rig, due - 990)  # the markers of the lead before the due times unread
    cycle(rig)
    assert delivered(rig) == [late, kept]
    assert answers(rig)[cancel.key]["outcome"] == "cancelled"
    # A cancel appended inside the lead, read only after the forward: too late, and said.
    after = marker(rig, CANCEL, late, due - 300, offset=1)
    read_through(rig)
    clock.advance(30)  # past the bound where a message could still arrive
    cycle(rig)
    assert delivered(rig) == [late, kept]
    assert answers(rig)[after.key]["outcome"] == "too_late"


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_pass_that_began_exactly_the_lead_before_the_due_time_does_not_release_it(
    clock, exactly_once
):
    """A pass that began at D less the lead vouches only for the markers appended before
    that instant: a cancel appended in it may have come just after the pass asked where
    the topic ends, and it is `cancel_lead` before D, so it must be honoured. The
    record waits for the next pass."""
    rig = rig_for(clock, exactly_once, cancel_lead_ms=1_000)
    due = clock.ms() - 100
    mid = send(rig, 0, 0, due - LEVEL.delay_ms)
    read_through(rig, due - 1_000)
    cycle(rig)
    assert delivered(rig) == [], "released by a pass that may have missed a cancel"
    cancel = marker(rig, CANCEL, mid, due - 1_000, offset=0)
    read_through(rig, due - 999)
    cycle(rig)
    assert delivered(rig) == []
    assert answers(rig)[cancel.key]["outcome"] == "cancelled"


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_cancel_appended_before_the_due_time_withdraws_the_message(clock, exactly_once):
    rig = rig_for(clock, exactly_once)
    now = clock.ms()
    kept = send(rig, 0, 0, now - LEVEL.delay_ms - 50)
    gone = send(rig, 0, 1, now - LEVEL.delay_ms - 40)
    after = send(rig, 0, 2, now - LEVEL.delay_ms - 30)
    cancel = marker(rig, CANCEL, gone, now - 1_000, offset=0)
    read_through(rig)
    cycle(rig)
    assert delivered(rig) == [kept, after]
    assert committed(rig, 0) == 3, "the withdrawn record's offset commits with the rest"
    reply = answers(rig)[cancel.key]
    assert (reply["kind"], reply["id"], reply["outcome"]) == (CANCEL, gone, "cancelled")
    assert rig.metric("delayservice_level_markers_total", kind=CANCEL, outcome="cancelled") == 1
    assert rig.metric("delayservice_forwarded_total") == 2


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_second_cancel_of_a_cancelled_message_is_answered_cancelled_at_once(clock, exactly_once):
    """The book remembers that a message was cancelled for good: a cancel sent again
    (a client's retry) before the due time is told so at once. The flag was set and
    cleared in one step, so the retry waited out its message's time and was then told
    no such message was waiting."""
    rig = rig_for(clock, exactly_once)
    now = clock.ms()
    due = now + 2_000
    mid = send(rig, 0, 0, due - LEVEL.delay_ms)
    first = marker(rig, CANCEL, mid, now - 100, offset=0)
    read_through(rig)
    cycle(rig)
    clock.advance(3.0)  # past its due time: withdrawn
    read_through(rig)
    cycle(rig)
    assert answers(rig)[first.key]["outcome"] == "cancelled"
    assert delivered(rig) == []
    assert rig.markers is not None
    assert rig.markers.book.final_of(mid) == CANCELLED
    again = marker(rig, CANCEL, mid, due - 500, offset=1)  # asked before the due time
    clock.advance(0.2)
    read_through(rig)
    cycle(rig)
    assert answers(rig)[again.key]["outcome"] == "cancelled"


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_cancel_after_the_due_time_is_too_late_and_says_so(clock, exactly_once):
    rig = rig_for(clock, exactly_once)
    now = clock.ms()
    mid = send(rig, 1, 0, now - LEVEL.delay_ms - 500)  # due 500 ms ago, not yet sent
    cancel = marker(rig, CANCEL, mid, now - 100, offset=0)
    read_through(rig)
    cycle(rig)
    assert delivered(rig) == [mid]
    assert answers(rig)[cancel.key]["outcome"] == "too_late"


@pytest.mark.parametrize("exactly_once", GUARANTEES)
@pytest.mark.parametrize("later", [True, False])
def test_a_reschedule_moves_a_queued_message_to_the_level_that_holds_what_is_left(
    clock, exactly_once, later
):
    """Found in its queue, the message is moved at once: a copy, due no earlier than the
    new time, on the smallest level at least as long as what is left, answered `moved`
    in the same transaction; the original is withdrawn when its turn comes."""
    rig = rig_for(clock, exactly_once)
    now = clock.ms()
    mid = send(rig, 2, 0, now - 1_000)  # due in 4 s
    asked = now + (15_000 if later else 500)
    move = marker(rig, RESCHEDULE, mid, now - 10, offset=3, asked=asked)
    read_through(rig)
    cycle(rig)
    (copy,) = [s for s in rig.producer.visible() if s.topic != OUTCOMES]
    level = LEVELS.select(asked - now)
    assert copy.topic == level.topic
    assert level.delay_ms >= asked - now
    assert copy.header(H_DUE_MS) == str(asked).encode()
    assert copy.header(H_DELAY_MS) == str(asked - now).encode()
    assert copy.header(H_MOVED_BY) == f"{now - 10}:0:3".encode()
    assert (copy.key, copy.value) == (b"k", b"v")
    reply = answers(rig)[move.key]
    assert (reply["outcome"], reply["due_ms"]) == ("moved", asked)
    assert reply["copy"] == f"{copy.topic}:{copy.partition}"
    clock.advance(5)  # the original falls due: withdrawn, never forwarded
    read_through(rig)
    cycle(rig)
    assert delivered(rig) == []
    assert committed(rig, 2) == 1
    assert len([s for s in rig.producer.visible() if s.topic == level.topic]) == 1


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_move_filed_while_a_slow_serve_pass_runs_fits_the_longest_level(clock, exactly_once):
    """A reschedule to just under the longest level, filed by the reader while a serve
    pass that began earlier still runs (a flood, a loaded host): its copy was timed
    from the pass's start, so its delay-ms came out longer than any level and the copy
    was dead-lettered (`delay_out_of_range`) when due: the message lost to the dead
    letter topic. Timed from when the copy is made, it fits."""
    rig = rig_for(clock, exactly_once)
    markers = rig.markers
    assert markers is not None
    mid = send(rig, 2, 0, clock.ms() - 1_000)
    read_through(rig)
    cycle(rig)
    entries = markers.book.entries
    filed: list[LevelMarker] = []

    def slow_entries(*args: Any) -> Any:
        if not filed:  # the pass began; the reader files a move half a second later
            clock.advance(0.5)
            at = clock.ms()
            filed.append(marker(rig, RESCHEDULE, mid, at, offset=4, asked=at + MAX_DELAY_MS - 200))
            gate = markers.gate
            gate.advance(at + 1, at + 1, gate.generation)
        return entries(*args)

    markers.book.entries = slow_entries  # type: ignore[method-assign]
    clock.advance(CHECK_MS / 1000)  # the next look is due
    cycle(rig)
    markers.book.entries = entries  # type: ignore[method-assign]
    (copy,) = [s for s in rig.producer.visible() if s.topic != OUTCOMES]
    assert copy.topic == LEVELS.levels[-1].topic
    assert int(copy.header(H_DELAY_MS)) <= MAX_DELAY_MS, "longer than any level holds"
    assert copy.header(H_DUE_MS) == str(filed[0].asked_due_ms).encode()


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_move_already_answered_is_not_made_again(clock, exactly_once):
    """After a restart the original is read again: the answer of the move, read back
    from the outcomes topic, says its copy exists, so it is withdrawn, not copied twice."""
    rig = rig_for(clock, exactly_once)
    now = clock.ms()
    mid = send(rig, 0, 0, now - LEVEL.delay_ms - 10)
    move = marker(rig, RESCHEDULE, mid, now - 2_000, offset=5, asked=now + 30_000)
    assert rig.markers is not None
    from delayservice.markers.replies import MarkerReply

    done = MarkerReply(RESCHEDULE, mid, "moved", now + 30_000, copy="delay_topic_4:1")
    rig.markers.book.answer_read(move.key, done, now - 1_500)
    read_through(rig)
    cycle(rig)
    assert [s for s in rig.producer.visible() if s.topic != OUTCOMES] == []
    assert answers(rig) == {}
    assert committed(rig, 0) == 1


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_cancel_wins_over_a_reschedule_in_either_order(clock, exactly_once):
    rig = rig_for(clock, exactly_once)
    now = clock.ms()
    first = send(rig, 0, 0, now - LEVEL.delay_ms - 30)
    second = send(rig, 0, 1, now - LEVEL.delay_ms - 20)
    a_cancel = marker(rig, CANCEL, first, now - 900, offset=0)
    a_move = marker(rig, RESCHEDULE, first, now - 800, offset=1, asked=now + 9_000)
    b_move = marker(rig, RESCHEDULE, second, now - 700, offset=2, asked=now + 9_000)
    b_cancel = marker(rig, CANCEL, second, now - 600, offset=3, asked=None)
    del b_move
    read_through(rig)
    cycle(rig)
    outcomes = answers(rig)
    assert outcomes[a_cancel.key]["outcome"] == "cancelled"
    assert outcomes[a_move.key]["outcome"] == "cancelled"
    assert outcomes[b_cancel.key]["outcome"] == "cancelled"
    assert delivered(rig) == []
    assert [s for s in rig.producer.visible() if s.topic not in (OUTCOMES,)] == []


def test_an_aborted_transaction_takes_its_decisions_back(clock):
    """Exactly-once: what a marker decided commits with the transaction or not at all;
    when the answer's delivery fails the transaction aborts, and the decision is made
    again and answered once."""
    rig = rig_for(clock, True)
    now = clock.ms()
    mid = send(rig, 0, 0, now - LEVEL.delay_ms - 30)
    cancel = marker(rig, CANCEL, mid, now - 900, offset=0)
    read_through(rig)
    failed: list[str] = []

    def fail_first_answer(sent: Any) -> KafkaError | None:
        if sent.topic == OUTCOMES and not failed:
            failed.append(sent.key.decode())
            return kafka_error(KafkaError._MSG_TIMED_OUT, retriable=True)
        return None

    rig.producer.outcome = fail_first_answer
    for _ in range(4):
        cycle(rig)
        clock.advance(2)
        read_through(rig)
    assert failed == [cancel.key.decode()]
    assert rig.producer.aborted, "the transaction holding the failed answer was aborted"
    assert [s.key for s in rig.producer.visible(OUTCOMES)] == [cancel.key]
    assert answers(rig)[cancel.key]["outcome"] == "cancelled"
    assert delivered(rig) == []
    assert committed(rig, 0) == 1


def test_markers_of_partitions_it_does_not_hold_cost_the_run_nothing(clock):
    rig = rig_for(clock, False)
    assert rig.markers is not None
    other = level_id(LEVEL.index, 2, clock.ms())
    marker(rig, CANCEL, other, clock.ms(), offset=0)
    held = (0, 0, TARGET, b"v", b"k", (), b"another-id", b"5000", None)
    named = (1, 0, TARGET, b"v", b"k", (), other.encode(), b"5000", None)
    assert rig.markers.screen((LEVEL.topic, 0), [held, named]) is None
    assert rig.markers.screen((LEVEL.topic, 2), [held, named]) == [1]


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_cancel_after_a_move_withdraws_the_copy(clock, exactly_once):
    """The copy is the message now: a cancel appended after the move and before the
    copy's due time calls it off, and the original stays withdrawn."""
    rig = subscribed(
        make_level_rig(clock=clock, exactly_once=exactly_once, markers=True, levels=(LEVEL, LONGER))
    )
    rig.consumer.queue_rebalance("assign", 0, 1, 2, (LONGER.topic, 0), (LONGER.topic, 1),
                                 (LONGER.topic, 2))  # fmt: skip
    step(rig)
    now = clock.ms()
    mid = send(rig, 0, 0, now - 1_000)
    move = marker(rig, RESCHEDULE, mid, now - 10, offset=0, asked=now + 15_000)
    read_through(rig)
    cycle(rig)
    (copy,) = [s for s in rig.producer.visible() if s.topic == LONGER.topic]
    assert copy.header(H_MOVED_BY) == f"{move.appended_ms}:0:0".encode()
    clock.advance(2)
    cancel = marker(rig, CANCEL, mid, clock.ms(), offset=1)
    rig.consumer.append(
        (LONGER.topic, copy.partition),
        message(copy.partition, 0, clock.ms() - 1, headers=copy.headers, topic=LONGER.topic),
    )
    clock.advance(LONGER.delay_ms / 1000)
    read_through(rig)
    cycle(rig)
    assert delivered(rig) == []
    assert answers(rig)[cancel.key]["outcome"] == "cancelled"
    assert answers(rig)[move.key]["outcome"] == "moved"
    assert committed(rig, 0) == 1


def test_at_least_once_answers_a_move_only_once_its_copy_is_durable(clock):
    """The answer `moved` is what tells a daemon reading the original again that its
    copy exists: written before the copy is durable, a refused copy would leave the
    message nowhere."""
    rig = rig_for(clock, False)
    now = clock.ms()
    mid = send(rig, 0, 0, now - 1_000)
    move = marker(rig, RESCHEDULE, mid, now - 10, offset=0, asked=now + 15_000)
    read_through(rig)
    step(rig)
    forward(rig, commit=True)  # the copy goes out; this commit point flushes it, then
    # writes the answer, which the next one flushes
    assert [s.topic for s in rig.producer.sent] == [LONGER.topic, OUTCOMES]
    (copy,) = rig.producer.reports
    assert copy.topic == LONGER.topic
    assert answers(rig) == {}
    forward(rig, commit=True)
    assert answers(rig)[move.key]["outcome"] == "moved"
    assert [s.topic for s in rig.producer.sent] == [LONGER.topic, OUTCOMES]


def test_at_least_once_a_refused_copy_is_made_again_and_answered_once(clock):
    rig = rig_for(clock, False)
    now = clock.ms()
    mid = send(rig, 1, 0, now - 1_000)
    move = marker(rig, RESCHEDULE, mid, now - 10, offset=0, asked=now + 15_000)
    read_through(rig)
    refused: list[str] = []

    def refuse_first_copy(sent: Any) -> KafkaError | None:
        if sent.topic == LONGER.topic and not refused:
            refused.append(sent.topic)
            return kafka_error(KafkaError.MSG_SIZE_TOO_LARGE)
        return None

    rig.producer.outcome = refuse_first_copy
    for _ in range(3):
        cycle(rig)
        clock.advance(0.3)
        read_through(rig)
    copies = [s for s in rig.producer.visible() if s.topic == LONGER.topic]
    assert refused == [LONGER.topic]
    assert len(copies) == 1, "the refused copy was made again, once"
    assert [s.key for s in rig.producer.visible(OUTCOMES)] == [move.key]


def test_the_reader_wakes_the_forwarder_only_when_it_has_markers_to_serve(clock):
    rig = rig_for(clock, False)
    markers = rig.markers
    assert markers is not None
    assert markers.wake == rig.group.wake, "the partition group gives its wake"
    woken: list[int] = []
    markers.wake = lambda: woken.append(1)
    cycle(rig)
    clock.advance(1)
    markers.nudge()
    assert woken == [], "no marker names a partition it owns: it sleeps on"
    mid = level_id(LEVEL.index, 1, clock.ms())  # not read yet: its marker waits
    marker(rig, CANCEL, mid, clock.ms(), offset=0)
    markers.nudge()
    assert woken == [1], "a new marker: served now, not when a record falls due"
    read_through(rig)
    cycle(rig)
    woken.clear()
    markers.nudge()
    assert woken == [], "served just now; the next look is not due yet"
    clock.advance(0.3)
    markers.nudge()
    assert woken == [1], "a marker still unanswered is looked at again"


def test_a_slow_serve_pass_is_not_followed_by_another_at_once(clock):
    """A serve pass slower than `CHECK_MS` (a flood of markers, a loaded host) used to
    be followed by the next at once, so the forwarder did nothing else and the reader
    waited for the book. The next look counts from the end of a pass, and a change of
    the book asks for one no sooner than `SERVE_GAP_MS` after it."""
    rig = rig_for(clock, False)
    markers = rig.markers
    assert markers is not None
    mid = level_id(LEVEL.index, 1, clock.ms())  # not read yet: its marker waits
    marker(rig, CANCEL, mid, clock.ms(), offset=0)
    read_through(rig)
    entries = markers.book.entries

    def slow_entries(*args: Any) -> Any:
        clock.advance(2 * CHECK_MS / 1000)
        return entries(*args)

    markers.book.entries = slow_entries  # type: ignore[method-assign]
    assert markers.waiting()
    route = rig.forwarder.sender.route
    assert isinstance(route, LevelRoute)
    markers.serve(route)
    markers.book.entries = entries  # type: ignore[method-assign]
    assert not markers.waiting(), "a pass that took longer than CHECK_MS, begun again"
    marker(rig, CANCEL, level_id(LEVEL.index, 2, clock.ms()), clock.ms(), offset=1)
    assert not markers.waiting(), "a change of the book within SERVE_GAP_MS of a pass"
    clock.advance(SERVE_GAP_MS / 1000)
    assert markers.waiting(), "a change of the book is served once the gap has passed"
    markers.serve(route)
    clock.advance((CHECK_MS - 1) / 1000)
    assert not markers.waiting()
    clock.advance(0.001)
    assert markers.waiting(), "markers still unanswered are looked at again"


@pytest.mark.parametrize("exactly_once", GUARANTEES)
def test_a_partition_just_assigned_is_not_taken_for_one_where_the_message_never_came(
    clock, exactly_once
):
    """Right after an assignment (a restart, a rebalance) the queue is empty because
    nothing was handed over yet, not because the message is not there: its marker is
    answered only once the partition has stayed quiet since."""
    rig = rig_for(clock, exactly_once)
    now = clock.ms()
    mid = level_id(LEVEL.index, 1, now - 60_000)  # due long ago, not read (a backlog)
    cancel = marker(rig, CANCEL, mid, now - 59_000, offset=0)
    read_through(rig)
    cycle(rig)
    assert cancel.key not in answers(rig), "answered before the partition was read"
    clock.advance(EMPTY_GRACE_MS / 1000)
    read_through(rig)
    cycle(rig)
    assert answers(rig)[cancel.key]["outcome"] == "too_late"
