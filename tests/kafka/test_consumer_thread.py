"""The consumer-thread life the level loop and the precise intake share: one script of
iterations runs on the real thread, and what each kind of failure leads to is checked
from outside (counts, the client replaced or not, the daemon stopped or not)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from delayservice.kafka import consumer_thread
from delayservice.kafka.consumer_keeper import REPLACEMENTS_ALLOWED, ConsumerKeeper
from delayservice.kafka.consumer_thread import ConsumerThread
from tests.level.fakes import ErrorTopicPartition, raise_bare_kafka_error


class Count:
    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class Client:
    """Only what the keeper touches: a client is closed when replaced or at the end."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


Step = Callable[[], None]


class Scripted(ConsumerThread):
    """Runs `script` one step per iteration, then stops; records the hooks it ran."""

    def __init__(self, script: list[Step], fatal: list[str], *, open_fails: bool = False):
        self.loop_errors, self.commits, self.failures = Count(), Count(), Count()
        super().__init__(
            "scripted",
            "scripted",
            fatal.append,
            loop_errors=self.loop_errors,
            commits=self.commits,
            commit_failures=self.failures,
        )
        self._script = list(script)
        self._open_fails = open_fails
        self.clients: list[Client] = []
        self.hooks: list[str] = []
        self.keeper: ConsumerKeeper | None = None

    def _make(self, _callbacks: dict[str, Any]) -> Any:
        self.clients.append(Client())
        return self.clients[-1]

    def _open(self) -> ConsumerKeeper:
        if self._open_fails:
            raise RuntimeError("no such group")
        self.keeper = ConsumerKeeper(
            "scripted", self._make, self.on_error, lambda *_: None, self._on_fatal
        )
        return self.keeper

    def _kept(self) -> ConsumerKeeper | None:
        return self.keeper

    def _iteration(self) -> None:
        if not self._script:
            self.request_stop()
            return
        self._script.pop(0)()

    def _recover(self) -> None:
        self.hooks.append("recover")

    def _replaced(self) -> None:
        self.hooks.append("replaced")

    def _shutdown(self) -> None:
        self.hooks.append("shutdown")
        if self.keeper is not None:
            self.keeper.close()


def run(thread: Scripted) -> Scripted:
    thread.start()
    assert thread.join(30.0), "the thread did not end"
    return thread


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consumer_thread, "ERROR_PAUSE_S", 0.0)


def raising(exc: Exception) -> Step:
    def step() -> None:
        raise exc

    return step


def test_an_exception_of_an_iteration_is_counted_recovered_from_and_survived() -> None:
    fatal: list[str] = []
    ran = threading.Event()
    thread = run(Scripted([raising(ValueError("bad record")), ran.set], fatal))
    assert ran.is_set()  # the next iteration ran
    assert thread.loop_errors.value == 1
    assert thread.hooks == ["recover", "shutdown"]
    assert fatal == []


def test_a_kafka_error_that_is_not_fatal_is_survived_like_any_other() -> None:
    fatal: list[str] = []
    error = KafkaException(KafkaError(KafkaError._TRANSPORT, "broker away"))
    thread = run(Scripted([raising(error)], fatal))
    assert thread.loop_errors.value == 1
    assert thread.hooks == ["recover", "shutdown"]
    assert len(thread.clients) == 1


def raising_bare(error: KafkaError) -> Step:
    def step() -> None:
        raise_bare_kafka_error(error)

    return step


def test_a_bare_kafka_error_is_taken_as_the_kafka_exception_it_should_have_been() -> None:
    """confluent-kafka can raise the `KafkaError` itself, which matches no `except`
    naming a class: not fatal, survived; fatal, the client replaced."""
    fatal: list[str] = []
    ran = threading.Event()
    away = KafkaError(KafkaError._TRANSPORT, "broker away")
    fenced = KafkaError(KafkaError._FATAL, "fenced", fatal=True)
    thread = run(Scripted([raising_bare(away), raising_bare(fenced), ran.set], fatal))
    assert ran.is_set()
    assert thread.loop_errors.value == 1  # the first; the second replaced the client
    assert len(thread.clients) == 2
    assert thread.hooks == ["recover", "replaced", "shutdown"]
    assert fatal == []


def test_a_fatal_client_error_replaces_the_client_without_stopping() -> None:
    fatal: list[str] = []
    error = KafkaException(KafkaError(KafkaError._FATAL, "fenced", fatal=True))
    thread = run(Scripted([raising(error), lambda: None], fatal))
    assert len(thread.clients) == 2
    assert thread.clients[0].closed  # the unusable one
    assert thread.hooks == ["replaced", "shutdown"]
    assert thread.loop_errors.value == 0  # not the iteration's fault
    assert fatal == []


def test_a_fatal_error_reported_by_callback_replaces_the_client_too() -> None:
    fatal: list[str] = []
    holder: list[Scripted] = []

    def report() -> None:
        holder[0].on_error(KafkaError(KafkaError._FATAL, "fenced", fatal=True))

    thread = Scripted([report, lambda: None], fatal)
    holder.append(thread)
    run(thread)
    assert len(thread.clients) == 2
    assert fatal == []


def test_a_client_that_keeps_failing_stops_the_daemon_and_still_shuts_down() -> None:
    fatal: list[str] = []
    error = KafkaException(KafkaError(KafkaError._FATAL, "fenced", fatal=True))
    script: list[Step] = [raising(error)] * (REPLACEMENTS_ALLOWED + 1)
    thread = run(Scripted(script, fatal))
    assert len(thread.clients) == REPLACEMENTS_ALLOWED + 1
    assert len(fatal) == 1
    assert "fenced" in fatal[0]
    assert thread.hooks[-1] == "shutdown"


def test_a_consumer_that_cannot_start_stops_the_daemon() -> None:
    fatal: list[str] = []
    thread = run(Scripted([], fatal, open_fails=True))
    assert len(fatal) == 1
    assert "no such group" in fatal[0]
    assert thread.hooks == []  # nothing to shut down


def test_all_brokers_down_is_noted_and_not_fatal() -> None:
    fatal: list[str] = []
    thread = Scripted([], fatal)
    thread.on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "down"))
    assert thread.broker_down
    assert fatal == []


def test_a_commit_answer_counts_only_what_the_broker_confirmed() -> None:
    thread = Scripted([], [])
    ok = TopicPartition("t", 0, 10)
    bad = ErrorTopicPartition("t", 1, 7, KafkaError(KafkaError.REBALANCE_IN_PROGRESS))
    done, failed = thread._answered(None, [ok, bad])
    assert [(tp.partition, tp.offset) for tp in done] == [(0, 10)]
    assert [tp.partition for tp in failed] == [1]
    assert (thread.commits.value, thread.failures.value) == (1, 1)

    done, failed = thread._answered(KafkaError(KafkaError.REQUEST_TIMED_OUT), [ok])
    assert done == []
    assert [tp.partition for tp in failed] == [0]
    assert thread.failures.value == 2

    assert thread._answered(KafkaError(KafkaError._NO_OFFSET), []) == ([], [])
    assert thread.failures.value == 2  # nothing was asked for: no failure
