"""Every Python example in the README and docs/ runs, as written, against a real broker
with a real daemon (levels and precise mode), each in a process of its own.

The one change made to an example is its broker: `broker:9092` stands for the test
broker. Its settings come the way an application's would, from `DELAYSERVICE_*`
variables (the test's own topic names). A block that is a piece of a program, not one,
carries `<!-- fragment -->` on the line before it and is left out; there are none yet.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic

from delayservice.levels import DEFAULT_LEVELS
from delayservice.settings_loading import settings_env
from tests.docs.markdown import PAGES, blocks

pytestmark = pytest.mark.kafka

BROKER = "broker:9092"
TOPICS = ("orders", "reminders")
"""The real topics the examples send to."""

EXAMPLES = [block for page in PAGES for block in blocks(page) if block.language == "python"]


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A daemon with the default levels and precise mode, and the examples' topics."""
    from tests.conftest import Testbed

    bed = Testbed(kafka_bootstrap, uuid.uuid4().hex[:8])
    settings = bed.settings(
        levels=DEFAULT_LEVELS,
        precise=True,
        precise_topic=f"dp-{bed.tag}",
        data_dir=tmp_path_factory.mktemp("data"),
        precise_lookahead_s=2.0,
    )
    bed.create_delay_topics(settings)
    for future in bed.admin.create_topics([NewTopic(t, 3, 1) for t in TOPICS]).values():
        try:
            future.result(30)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    daemon = bed.start_daemon(settings)
    try:
        bed.wait_for(lambda: daemon.readiness()[0], 120, "the daemon to be ready")
        yield bed, settings
    finally:
        bed.close()


def test_the_docs_have_python_examples():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("block", EXAMPLES, ids=lambda b: b.name)
def test_every_python_example_runs(block, stack, tmp_path: Path):
    if block.fragment:
        pytest.skip("marked as a fragment")
    bed, settings = stack
    assert BROKER in block.body, "an example names its broker as broker:9092"
    script = tmp_path / "example.py"
    script.write_text(block.body.replace(BROKER, bed.bootstrap))
    result = subprocess.run(
        [sys.executable, str(script)],
        env=settings_env(settings),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, f"{block.name} failed:\n{result.stderr}"
