"""A reader that acts on each record as it arrives must never ask librdkafka for a
batch with a timeout: `consume(n, t)` waits out all of `t` unless `n` records come
(the precise intake held a 10 ms exact message for up to 200 ms that way)."""

from __future__ import annotations

from typing import Any

from delayservice.kafka.ready_batch import ready_batch
from tests.precise.intake_rig import Rig, record, wait


class _Queue:
    """librdkafka's contract: `consume(n, t)` returns early only with `n` records."""

    def __init__(self, queued: list[Any], arriving: list[Any]) -> None:
        self.queued, self.arriving = queued, arriving
        self.calls: list[tuple[int, float]] = []
        self.waited = 0.0

    def consume(self, num: int, timeout: float) -> list[Any]:
        self.calls.append((num, timeout))
        if len(self.queued) < num and timeout > 0:
            self.waited += timeout
            self.queued += self.arriving
            self.arriving = []
        out, self.queued = self.queued[:num], self.queued[num:]
        return out


def test_what_is_queued_comes_back_without_waiting():
    queue = _Queue(["a", "b"], [])
    assert ready_batch(queue, 2000, 0.2) == ["a", "b"]
    assert queue.waited == 0


def test_with_nothing_queued_it_waits_for_the_first_record_only():
    queue = _Queue([], ["a", "b"])
    assert ready_batch(queue, 2000, 0.2) == ["a"]
    assert queue.calls == [(2000, 0), (1, 0.2)]


def test_the_precise_intake_never_waits_for_a_full_batch(tmp_path):
    rig = Rig(tmp_path)
    rig.intake.start()
    try:
        rig.run_batch([record(0)])
        assert wait(lambda: len(rig.consumer.calls) >= 3)
    finally:
        rig.stop()
    assert all(num == 1 or timeout == 0 for num, timeout in rig.consumer.calls), rig.consumer.calls[
        :5
    ]
