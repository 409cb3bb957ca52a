"""A record the intake cannot store goes to the forwarder as a dead letter, and its
offset (and every later one of its partition) commits only once that dead letter is
durable: a crash before then reads it again instead of losing it."""

from __future__ import annotations

from pathlib import Path

from delayservice.envelope import H_VERSION
from tests.level.fakes import message
from tests.precise.intake_rig import NOW_MS, TOPIC, record, running, wait


def test_offsets_commit_past_a_dead_letter_only_once_it_is_durable(tmp_path: Path):
    with running(tmp_path) as rig:
        bad = message(0, 1, NOW_MS, headers=[(H_VERSION, b"9")], topic=TOPIC)
        rig.feed([record(0), bad, record(2), record(3)])
        assert wait(lambda: len(rig.dead.submitted) == 1)
        assert wait(lambda: rig.consumer.committed_offsets.get(0) == 1)
        rig.feed([record(4)])  # later batches do not move it past the dead letter
        rig.consumer.wait_drained()
        assert wait(lambda: rig.intake.ledger.partitions[0].next_offset == 5)
        assert rig.consumer.committed_offsets[0] == 1
        (letter,) = rig.dead.submitted
        rig.intake.ledger.settle(letter.slot, letter.offset(), 0)  # the forwarder's commit point
        assert wait(lambda: rig.consumer.committed_offsets.get(0) == 5)


def test_a_commit_the_broker_refused_is_asked_again(tmp_path: Path):
    """Commits are asynchronous: a refusal comes back in a later consume, and the same
    offsets are committed again rather than taken as done."""
    from confluent_kafka import KafkaError

    with running(tmp_path) as rig:
        with rig.consumer.lock:
            rig.consumer.commit_error = KafkaError(KafkaError.REBALANCE_IN_PROGRESS)
        rig.run_batch([record(0), record(1)])
        assert wait(lambda: rig.intake.ledger.last_committed(0) == 2)
        assert rig.metrics.commit_failures.labels("exact")._value.get() == 1
