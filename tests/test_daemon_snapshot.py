"""A test that gives up waiting for records says what its daemons were doing."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.kafka


def test_a_collect_that_times_out_names_the_daemons_figures_and_threads(testbed):
    settings = testbed.settings(levels="1s")
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(f"snap-{testbed.tag}")
    daemon = testbed.start_daemon(settings)
    testbed.wait_assigned(daemon, partitions=settings.partitions)
    producer = testbed.producer(settings)
    producer.produce(target, b"never awaited long enough", delay=1)
    assert producer.flush(10) == 0

    with pytest.raises(pytest.fail.Exception) as failed:
        testbed.collect(target, 2, timeout=3)

    message = str(failed.value)
    assert f"{target}: got " in message
    assert "delayservice_consumed_total" in message  # the one record was read
    assert "consumer-levels: " in message  # and where the consumer thread stood
    assert "offsets 0-" in message  # and where the topic ends, as the reader saw it
