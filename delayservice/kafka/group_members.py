"""Who is in a consumer group, as the broker describes it, and waiting for it to empty.

What start-up refusals rest on (`level.layout_guard`, `precise.member_lease`). A member
is not proof of a live process: a static member stays in its group after a stop or a
kill until its session times out, and a dynamic one after a kill. So the callers wait
for members to go before they take one for a live process.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException

log = logging.getLogger(__name__)

ASK_EVERY_S: Final = 1.0
"""How often `wait_until_empty` asks again."""
ADMIN_TIMEOUT_S: Final = 5.0
_QUIET_STATES: Final = ("Empty", "Dead")
"""The states `list_groups` gives a group with no live member."""


@dataclass(frozen=True)
class Member:
    """One member of a group, as the broker describes it."""

    group: str
    member_id: str
    client_id: str
    host: str

    @property
    def known(self) -> bool:
        """False for the stand-in of a group busy with no member listed."""
        return not self.member_id.startswith("(")

    def __str__(self) -> str:
        ids = f"member {self.member_id} client {self.client_id} host {self.host}"
        return f"{self.group}: {ids}"


def members(admin: Any, groups: list[str]) -> list[Member] | None:
    """The members of `groups` (a group busy without any, mid-rebalance, counts as one
    member with no ids); None when the broker does not answer.

    Asked with the classic `list_groups` (ListGroups, then DescribeGroups, to each
    broker directly), never with `describe_consumer_groups`: librdkafka's admin requests
    that look up a group coordinator first can abort the whole process when the
    connection drops in the middle of one (the assertion `eonce->refcnt > 0` in
    `rd_kafka_admin_coord_response_parse`, librdkafka#4605, open in 2.16). A daemon
    asks while brokers restart, and one did abort that way in the fault suite.
    confluent-kafka marks `list_groups` deprecated in favour of the very calls that
    abort; it is kept until librdkafka fixes them."""
    found: list[Member] = []
    try:
        for group in groups:
            found.extend(_described(admin, group))
    except KafkaException as exc:
        log.info("groups %s not described yet (%r)", ", ".join(groups), exc)
        return None
    return found


def _described(admin: Any, group: str) -> list[Member]:
    """One group's members; a group never joined lists as none. Raises KafkaException."""
    found: list[Member] = []
    for described in admin.list_groups(group, timeout=ADMIN_TIMEOUT_S):
        if described.id != group:
            continue
        error = described.error
        if error is not None and error.code() != KafkaError.NO_ERROR:
            raise KafkaException(error)
        found.extend(Member(group, m.id, m.client_id, m.client_host) for m in described.members)
        if not described.members and described.state not in _QUIET_STATES:
            found.append(Member(group, f"(none yet, {described.state})", "-", "-"))
    return found


def wait_until_empty(
    admin: Any,
    groups: list[str],
    stop: threading.Event,
    budget_s: float,
    what: str,
    ignore: Callable[[Member], bool] | None = None,
) -> list[Member]:
    """[] once no group of `groups` has a member (or a stop is asked for); else the
    members still there after `budget_s` of answers. While the broker does not answer,
    keep asking: not knowing is not a refusal. `what`: the members, for the log;
    `ignore`: members known to be gone."""
    waited = 0.0
    said = False
    while not stop.is_set():
        live = members(admin, groups)
        if live is not None and ignore is not None:
            live = [m for m in live if not ignore(m)]
        if live == []:
            return []
        if live is not None:
            if waited >= budget_s:
                return live
            if not said:
                log.warning(
                    "waiting up to %.0fs for %s to leave (a stopped or killed member stays "
                    "until its session times out): %s",
                    budget_s,
                    what,
                    "; ".join(map(str, live)),
                )
                said = True
            waited += ASK_EVERY_S  # counted while answers come, not while the broker is away
        stop.wait(ASK_EVERY_S)
    return []


class GroupWatch:
    """A thread of its own that looks at a group while the daemon runs (`_run`); the
    daemon starts, stops and joins it as a worker."""

    name = "group-watch"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._thread.start()

    def request_stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> bool:
        if self._thread.ident is not None:
            self._thread.join(timeout)
        return not self._thread.is_alive()
