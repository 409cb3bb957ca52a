"""The compose stack's example producer and consumer, run for real outside Docker.

They run as the compose file runs them (`python deploy/examples/*.py` with the stack's
DELAYSERVICE_* variables), against the test broker and an in-process daemon, and stop
at once on SIGTERM as `docker compose down` asks them to.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.kafka

GOT = re.compile(
    r"got reminder \d+, asked (\d+)s \(key order-\d\): took ([\d.]+)s, (-?\d+) ms after"
)


def test_examples_show_delayed_messages_flowing(deploy, testbed, tmp_path):
    settings = testbed.settings(levels="1s,2s", partitions=1)
    testbed.create_delay_topics(settings)
    daemon = testbed.start_daemon(settings)
    testbed.wait_assigned(daemon, partitions=1)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DELAYSERVICE_")},
        "DELAYSERVICE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "DELAYSERVICE_LEVELS": settings.levels,
        "DELAYSERVICE_TOPIC_PREFIX": settings.topic_prefix,
        "DELAYSERVICE_PARTITIONS": "1",
        "EXAMPLE_TOPIC": f"reminders-{testbed.tag}",
        "EXAMPLE_DELAYS": "1,2",
        "EXAMPLE_INTERVAL": "0.2",
    }
    examples = deploy.root / "deploy" / "examples"
    logs = {name: tmp_path / f"{name}.log" for name in ("producer", "consumer")}
    processes = {
        name: subprocess.Popen([sys.executable, str(examples / f"{name}.py")], env=env,
                               stdout=log.open("wb"), stderr=subprocess.STDOUT)
        for name, log in logs.items()
    }  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        arrivals: list[tuple[str, str, str]] = []
        while len(arrivals) < 5:
            arrivals = GOT.findall(logs["consumer"].read_text())
            for name, process in processes.items():
                assert process.poll() is None, f"{name} exited:\n{logs[name].read_text()}"
            if time.monotonic() > deadline:
                pytest.fail(
                    f"the consumer saw {len(arrivals)} reminders:\n"
                    f"{logs['consumer'].read_text()}\n{logs['producer'].read_text()}"
                )
            time.sleep(0.2)
        for asked, took, late in arrivals:
            assert asked in {"1", "2"}
            assert float(took) >= int(asked), "never early"
            assert int(late) >= 0, "never before the due time"
    finally:
        for process in processes.values():
            process.send_signal(signal.SIGTERM)
        exits = {name: process.wait(20) for name, process in processes.items()}
    assert exits == {"producer": 0, "consumer": 0}, "SIGTERM stops the examples cleanly"
