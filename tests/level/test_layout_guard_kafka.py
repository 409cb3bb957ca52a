"""Both worker layouts at once, on a real broker: the second one refuses to start.

Issue 47, finding 3: a per-level daemon ran and a shared one was started beside it;
both forwarded every level record and a read_committed reader saw 1,776 duplicates of
2,000. Each layout now refuses to start while the other's groups have live members,
with one line naming them and exit code 2.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from confluent_kafka import Consumer

from delayservice.errors import ConfigError
from delayservice.level import layout
from delayservice.settings_loading import settings_env

pytestmark = pytest.mark.kafka

SESSION_S = 6.0
"""The refused process's session timeout (the broker's least): it waits three of them
for the other layout's members to leave before it refuses."""


def test_a_shared_daemon_refuses_to_start_beside_a_per_level_one_and_exits_2(testbed):
    testbed.level_workers = "per-level"
    settings = testbed.settings(levels="1s,2s")
    testbed.create_delay_topics(settings)
    running = testbed.start_daemon(settings, instance=f"old-{testbed.tag}")
    testbed.wait_assigned(running, partitions=3)

    shared = settings.model_copy(update={"level_workers": "shared"})
    env = settings_env(
        shared, instance_name=f"new-{testbed.tag}", session_timeout_s=SESSION_S, metrics_port=0
    )
    result = subprocess.run(
        [sys.executable, "-m", "delayservice", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )

    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2, result.stderr[-3000:]
    assert last.startswith("delayservice: invalid setting level_workers:"), last
    for plan in layout.workers(running.settings, "per-level"):  # each group, member, client
        assert f"{plan.group_id}: member {plan.member_id}-" in last, last
    assert last.count(" client delayservice-") == 2, last
    assert "stop every instance before changing level_workers" in last
    assert running.readiness()[0], running.readiness()  # the running one is untouched


def test_a_per_level_daemon_refuses_to_start_while_the_shared_group_has_a_member(testbed):
    testbed.level_workers = "per-level"
    settings = testbed.settings(levels="1s,2s", session_timeout_s=SESSION_S)
    testbed.create_delay_topics(settings)
    (shared_plan,) = layout.workers(settings, "shared")
    member = Consumer(
        {
            "bootstrap.servers": testbed.bootstrap,
            "group.id": shared_plan.group_id,
            "client.id": f"shared-{testbed.tag}",
        }
    )
    try:
        member.subscribe([level.topic for level in settings.level_set()])
        testbed.wait_for(
            lambda: member.poll(0.2) is None and bool(member.assignment()), 60, "a join"
        )

        with pytest.raises(ConfigError) as refused:
            testbed.start_daemon(settings)
    finally:
        member.close()  # dynamic: leaves the group at once

    line = str(refused.value)
    assert line.startswith("invalid setting level_workers: level_workers is 'per-level'"), line
    assert f"{shared_plan.group_id}: member " in line, line
    assert f"client shared-{testbed.tag} host " in line, line

    # Once the member has left, the same start goes ahead.
    testbed.start_daemon(settings)


def test_a_group_never_joined_is_no_conflict(testbed):
    from delayservice.kafka.group_members import members

    assert members(testbed.admin, [f"never-{uuid.uuid4().hex}"]) == []
