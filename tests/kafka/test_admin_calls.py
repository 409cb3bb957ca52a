"""The package never makes an admin request that looks up a group coordinator first.

librdkafka (2.16 and earlier) frees such a request's state when its connection drops
mid-request and then reads it again: the process aborts on the assertion
`eonce->refcnt > 0` in `rd_kafka_admin_coord_response_parse` (librdkafka#4605). A
daemon asks about groups while brokers restart; one aborted that way in the fault suite
(`test_broker_restart_under_traffic_loses_nothing[exactly-once]`, core dump in the
layout watch's `describe_consumer_groups`). What the package asks instead: the classic
`list_groups` (`kafka.group_members`) and a consumer's `committed()`
(`level.layout.OtherLayout`), which go through paths without that bug.
"""

from __future__ import annotations

import ast
from pathlib import Path

import delayservice

COORDINATOR_ADMIN_CALLS = {
    "describe_consumer_groups",
    "list_consumer_group_offsets",
    "alter_consumer_group_offsets",
    "delete_consumer_groups",
}


def _calls(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        found.extend(
            f"{path.relative_to(root.parent)}:{node.lineno} {node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in COORDINATOR_ADMIN_CALLS
        )
    return found


def test_no_admin_request_that_looks_up_a_coordinator(tmp_path):
    root = Path(delayservice.__file__).parent
    assert _calls(root) == []

    # The check sees such a call where one is written.
    planted = tmp_path / "delayservice"
    planted.mkdir()
    (planted / "m.py").write_text("def f(a):\n    return a.describe_consumer_groups(['g'])\n")
    assert _calls(planted) == ["delayservice/m.py:2 describe_consumer_groups"]
