"""A broker outage mid-run: the daemon reports not-ready, retries, and loses nothing.

This needs a broker of its own to kill and restart, so it always uses the project's
local broker (java and mvn), whatever `kafka_bootstrap` points at.
"""

from __future__ import annotations

import shutil

import pytest

from delayservice.producer import DelayProducer
from delayservice.testing.local_broker import LocalBroker

pytestmark = pytest.mark.kafka


@pytest.fixture
def own_broker():
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.fail("java and mvn are needed for the broker outage test")
    broker = LocalBroker(heap="512m").start()
    try:
        yield broker
    finally:
        broker.stop()


def test_a_broker_outage_makes_the_daemon_not_ready_and_loses_nothing(own_broker, testbed):
    # own_broker first: fixtures tear down in reverse, so the daemon stops before its broker.
    testbed.use_broker(own_broker.bootstrap)
    settings = testbed.settings(levels="2s", retry_backoff_s=0.5, retry_backoff_max_s=2)
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(f"outage-{testbed.tag}")
    daemon = testbed.start_daemon(settings)
    testbed.wait_assigned(daemon, partitions=settings.partitions)

    producer = DelayProducer({"bootstrap.servers": own_broker.bootstrap}, settings=settings)
    ids = {
        producer.produce(target, f"m{i}".encode(), key=str(i).encode(), delay=2) for i in range(200)
    }
    assert producer.flush(10) == 0
    producer.close()

    own_broker.kill()  # the records are due while the broker is away
    testbed.wait_for(lambda: not daemon.readiness()[0], 60, "the daemon to report not-ready")
    assert "broker unreachable" in daemon.readiness()[1]
    own_broker.restart()
    testbed.wait_for(lambda: daemon.readiness()[0], 90, "the daemon to be ready again")

    delivered = testbed.collect(target, len(ids), timeout=90)
    assert ids <= {dict(r.headers())["delay-id"].decode() for r in delivered}
