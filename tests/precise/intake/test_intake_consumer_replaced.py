"""A fatal consumer error in the precise intake: the client is replaced and reading
goes on from where it was, as the level consumer thread does (`ConsumerKeeper`);
only failures that keep coming stop the daemon."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import KafkaError, KafkaException

from delayservice.kafka.consumer_keeper import REPLACEMENTS_ALLOWED
from tests.precise.intake_rig import record, running, wait

FATAL = KafkaError(KafkaError._FATAL, "Broker: fenced", fatal=True)


def test_a_failed_client_is_replaced_and_reads_on_from_where_it_was(tmp_path: Path):
    with running(tmp_path) as rig:
        rig.run_batch([record(0), record(1)])
        assert rig.consumer.assigned == [[(0, -2)]]  # nothing committed: the beginning
        with rig.consumer.lock:
            rig.consumer.fail_next = KafkaException(FATAL)
        assert wait(lambda: rig.consumer.made == 2)
        assert wait(lambda: len(rig.consumer.assigned) == 2)
        assert rig.consumer.assigned[1] == [(0, 2)]  # after what it read, not from the start
        rig.run_batch([record(2)])
        assert rig.consumer.committed_offsets == {0: 3}
        assert rig.fatal == []
        assert rig.intake.is_alive()


def test_a_client_that_keeps_failing_stops_the_daemon_in_one_line(tmp_path: Path):
    with running(tmp_path) as rig:
        rig.run_batch([record(0)])
        for made in range(2, REPLACEMENTS_ALLOWED + 2):
            with rig.consumer.lock:
                rig.consumer.fail_next = KafkaException(FATAL)
            assert wait(lambda made=made: rig.consumer.made == made or bool(rig.fatal))
        with rig.consumer.lock:
            rig.consumer.fail_next = KafkaException(FATAL)
        assert wait(lambda: bool(rig.fatal))
        (line,) = rig.fatal
        assert f"failed {REPLACEMENTS_ALLOWED + 1} times" in line
        assert "fenced" in line
