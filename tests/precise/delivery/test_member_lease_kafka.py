"""Two processes of one `precise_member`, on a real broker: they stop with one line.

Issue 47, finding 7: two processes with the same `precise_member` fenced each other's
transactions for ever (with two copies every fence is exempt from the rebuild limit).
Each precise process now holds a lease on the member: the second is refused at start
(exit 2), and two started at the same moment both stop (exit 1). Real processes: the
lease tells a live process from this host's dead one by its pid.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from delayservice.settings_loading import settings_env

pytestmark = pytest.mark.kafka

SESSION_S = 6.0
"""The broker's least session timeout: how long a member may be gone unnoticed."""
LINE = "precise_member 0 already runs in another process"


def _precise(testbed: Any, tmp_path: Path) -> Any:
    settings = testbed.settings(
        levels="1s",
        precise=True,
        precise_topic=f"dp-{testbed.tag}",
        data_dir=tmp_path / "a",
        guarantee="exactly-once",
        session_timeout_s=SESSION_S,
    )
    testbed.create_delay_topics(settings)
    return settings


def _spawn(settings: Any, tmp_path: Path, name: str) -> tuple[subprocess.Popen[bytes], Path]:
    env = settings_env(
        settings,
        data_dir=tmp_path / name,
        instance_name=f"twin-{name}-{settings.group_id}",
        metrics_port=0,
        log_level="WARNING",
    )
    log = tmp_path / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "delayservice", "run"], env=env, stdout=out, stderr=out
        )
    return process, log


def _last_line(log: Path) -> str:
    return log.read_text().strip().splitlines()[-1]


def _stop(*processes: subprocess.Popen[bytes]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def test_a_second_process_of_a_precise_member_is_refused_with_the_first_ones_ids(testbed, tmp_path):
    settings = _precise(testbed, tmp_path)
    first = testbed.start_daemon(settings)  # this process: its pid is in the line
    testbed.wait_for(lambda: first.readiness()[0], 60, "the first daemon to be ready")

    second, log = _spawn(settings, tmp_path, "b")
    try:
        code = second.wait(90)
    finally:
        _stop(second)

    line = _last_line(log)
    assert code == 2, log.read_text()[-3000:]
    assert line.startswith(
        f"delayservice: invalid setting precise_member: {LINE} "
        f"({settings.group_id}-precise-member-0: member "
    ), line
    from delayservice.precise.delivery.member_lease import lease_client_id

    assert f"client {lease_client_id(0)} host " in line, line
    assert first.readiness()[0], first.readiness()  # the first one goes on


@pytest.mark.long  # CI runs the second process refused beside a live first
def test_two_processes_of_a_precise_member_started_at_once_both_stop(testbed, tmp_path):
    settings = _precise(testbed, tmp_path)
    (a, log_a), (b, log_b) = _spawn(settings, tmp_path, "a"), _spawn(settings, tmp_path, "b")
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and None in (a.poll(), b.poll()):
            if 2 in (a.poll(), b.poll()):  # one looked after the other had joined
                break
            time.sleep(0.2)
        codes = (a.poll(), b.poll())
    finally:
        _stop(a, b)

    texts = log_a.read_text(), log_b.read_text()
    if 2 in codes:  # refused at start: the other must still have been running
        assert None in codes, (codes, texts)
        refused = texts[codes.index(2)]
        assert LINE in refused.strip().splitlines()[-1], refused[-3000:]
        return
    assert codes == (1, 1), (codes, [text[-3000:] for text in texts])
    for text in texts:
        assert f"stopping: {LINE}" in text, text[-3000:]
