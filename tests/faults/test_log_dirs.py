"""`deleted_everywhere` is what two fault rows thaw on: it must say False while a
broker still hosts the topic, and True once the topic is deleted."""

from __future__ import annotations

import pytest

from tests.faults.harness import wait_until
from tests.faults.log_dirs import brokers_of, deleted_everywhere, hosted_partitions

pytestmark = pytest.mark.kafka


def test_a_hosted_topic_is_not_deleted_and_a_deleted_one_is_once_its_logs_go(testbed):
    topic = testbed.create_topic(f"log-dirs-{testbed.tag}", 3)
    other = testbed.create_topic(f"log-dirs-other-{testbed.tag}", 2)
    brokers = brokers_of(testbed.admin.list_topics(timeout=10))
    assert wait_until(lambda: hosted_partitions(brokers, topic) == {0, 1, 2}, 30)
    assert not deleted_everywhere(testbed.admin, topic)

    testbed.admin.delete_topics([topic])[topic].result(30)
    assert wait_until(lambda: deleted_everywhere(testbed.admin, topic), 30)
    assert hosted_partitions(brokers, topic) == set()
    assert hosted_partitions(brokers, other) == {0, 1}
