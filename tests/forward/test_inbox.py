"""The inbox between a worker's consumer thread and its forwarder thread."""

from __future__ import annotations

import threading

from delayservice.forward.inbox import Inbox

A0, A1, B0 = ("a", 0), ("a", 1), ("b", 0)


class _Wakes:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def test_a_hand_over_asked_wakes_the_forwarder_and_is_taken_once() -> None:
    wakes = _Wakes()
    inbox = Inbox(wakes)
    request = inbox.ask_hand_over({A0, A1}, commit=True)
    assert wakes.count == 1
    assert request.partitions == {A0, A1}
    assert request.commit
    assert not request.done.is_set()
    assert inbox.hand_overs() == [request]
    assert inbox.hand_overs() == []


def test_a_hand_over_taken_by_the_forwarder_cannot_be_withdrawn() -> None:
    """The consumer thread serves a request itself only when the forwarder never took
    it: served twice, its partitions would be committed or dropped twice."""
    inbox = Inbox(_Wakes())
    taken = inbox.ask_hand_over({A0}, commit=False)
    queued = inbox.ask_hand_over({B0}, commit=True)
    assert inbox.withdraw(queued)
    assert inbox.hand_overs() == [taken]
    assert not inbox.withdraw(taken)
    assert not inbox.withdraw(queued)


def test_durable_offsets_are_taken_once_and_a_partition_forgotten_leaves_none() -> None:
    inbox = Inbox(_Wakes())
    inbox.made_durable({A0: 5, A1: 7})
    inbox.made_durable({A0: 9})
    inbox.forget({A1})
    assert inbox.take_durable() == {A0: 9}
    assert inbox.take_durable() == {}


def test_a_reseek_stands_until_the_consumer_thread_is_done_and_then_wakes_the_forwarder() -> None:
    wakes = _Wakes()
    inbox = Inbox(wakes)
    assert not inbox.reseek_wanted()
    inbox.ask_reseek()
    inbox.ask_reseek()
    assert inbox.reseek_wanted()
    inbox.reseek_done()
    assert not inbox.reseek_wanted()
    assert wakes.count == 1


def test_what_waits_out_a_backoff_is_the_earliest_per_topic_and_overall() -> None:
    inbox = Inbox(_Wakes())
    assert inbox.set_aside_due_ms is None
    inbox.set_aside({"a": 2_000, "b": 1_500})
    assert inbox.set_aside_due_by_topic == {"a": 2_000, "b": 1_500}
    assert inbox.set_aside_due_ms == 1_500
    inbox.set_aside({})
    assert inbox.set_aside_due_ms is None


def test_hand_overs_asked_from_many_threads_are_each_taken_exactly_once() -> None:
    inbox = Inbox(_Wakes())
    asked: list[object] = []
    lock = threading.Lock()

    def ask(partition: int) -> None:
        for _ in range(200):
            request = inbox.ask_hand_over({("a", partition)}, commit=True)
            with lock:
                asked.append(request)

    threads = [threading.Thread(target=ask, args=(p,)) for p in range(4)]
    for thread in threads:
        thread.start()
    taken: list[object] = []
    while any(thread.is_alive() for thread in threads):
        taken.extend(inbox.hand_overs())
    for thread in threads:
        thread.join()
    taken.extend(inbox.hand_overs())
    assert len(taken) == len(asked) == 800
    assert {id(r) for r in taken} == {id(r) for r in asked}
