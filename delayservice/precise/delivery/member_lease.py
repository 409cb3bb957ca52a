"""One process per `precise_member`.

Two processes given the same `precise_member` (a copied config, a second host started
with the first's) read the same partitions, each into its own data directory, and
both forward them. Exactly-once they share a transactional id, so each producer's
`init_transactions` fences the other's, and with two copies every fence is exempt
from the rebuild limit (`forward.producer_rebuild.SharedId`: a replica taking over fences
its owner on purpose): they fence each other for ever, and forward little.

Nothing in precise mode joins a consumer group (its placement is static, its intake
assigns partitions itself), so the broker cannot tell that two processes run one
member. This lease gives it a way: each process joins `{group_id}-precise-member-{m}`
as a dynamic member (it leaves the group when it stops; a killed one stays until its
session times out) and reads nothing. Then:

- Start-up waits, not ready, up to three session timeouts for the group to be empty,
  and refuses to start (exit 2) while a member stays: that one heartbeats, so it is a
  live process of this member, and the line names its client id (host and pid) and
  host. A member whose client id names this host and a pid that no longer runs (or
  this very pid: a container restarted) is this process's killed predecessor, and is
  not waited for: a restart after a crash costs no session timeout (invariant 8).
- Two started at the same moment both get past that look and both join. While it
  runs, each looks at the group every half session; a member other than itself seen
  for longer than a session timeout has heartbeated since it was first seen (a dead
  one is gone within a session), so both stop with the same line (exit 1).

Why not count fences instead: a replica that takes over fences its owner by design,
and so does any restart; how many fences in how long mean "another live process"
would be a guess, and a slow owner would look like one. A group's membership is the
broker's own answer to "who is alive".
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from confluent_kafka import Consumer

from delayservice.errors import ConfigError
from delayservice.kafka import client_config
from delayservice.kafka.group_members import GroupWatch, Member, members, wait_until_empty
from delayservice.settings import Settings

log = logging.getLogger(__name__)

WAIT_SESSIONS: Final = 3
"""How many session timeouts start-up waits for the last process of this member to go."""


def lease_group(settings: Settings) -> str:
    return f"{settings.group_id}-precise-member-{settings.precise_member}"


def lease_client_id(member: int, host: str | None = None, pid: int | None = None) -> str:
    host = host if host is not None else socket.gethostname()
    pid = pid if pid is not None else os.getpid()
    return f"delayservice-{host}-{pid}-member-{member}"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's: it runs
        return True
    return True


def predecessor(member: int, found: Member, running: Callable[[int], bool] = _running) -> bool:
    """Whether `found` was a process of `member` on this host that is gone: its pid no
    longer runs, or is this process's own (a container's first process, restarted)."""
    prefix, suffix = "delayservice-", f"-member-{member}"
    name = found.client_id
    if not (name.startswith(prefix) and name.endswith(suffix)):
        return False
    host, _, pid = name[len(prefix) : -len(suffix)].rpartition("-")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    return int(pid) == os.getpid() or not running(int(pid))


def duplicate(settings: Settings, others: list[Member]) -> str:
    """One line: who else runs this member, and what to do."""
    return (
        f"precise_member {settings.precise_member} already runs in another process "
        f"({'; '.join(map(str, others))}): two processes of one member forward the same "
        "records and fence each other's transactions for ever; give each instance its "
        "own precise_member (docs/precise-mode.md, One process per member)"
    )


class MemberLease(GroupWatch):
    name = "precise-member-lease"

    def __init__(
        self,
        settings: Settings,
        on_fatal: Callable[[str], None],
        make_admin: Callable[[], Any],
        make_consumer: Callable[[dict[str, Any]], Any] = Consumer,
        clock: Callable[[], float] = time.monotonic,
        running: Callable[[int], bool] = _running,
    ) -> None:
        self._settings = settings
        self._on_fatal = on_fatal
        self._make_admin = make_admin
        self._make_consumer = make_consumer
        self._clock = clock
        self._running = running
        self.group = lease_group(settings)
        self._session_s = settings.session_timeout_s
        self._look_every = max(1.0, self._session_s / 2)
        self._first_seen: dict[str, float] = {}
        """Another member's id -> when a look first saw it."""
        self._duplicate: str | None = None
        super().__init__()

    def claim(self, stop: threading.Event) -> None:
        """Before the precise workers start: wait for the group to empty; raise
        ConfigError naming who stays in it."""
        live = wait_until_empty(
            self._make_admin(),
            [self.group],
            stop,
            WAIT_SESSIONS * self._session_s,
            f"the last process of precise_member {self._settings.precise_member}",
            ignore=self._gone,
        )
        if live:
            raise ConfigError("precise_member", duplicate(self._settings, live))

    def _gone(self, found: Member) -> bool:
        return predecessor(self._settings.precise_member, found, self._running)

    def health(self) -> tuple[bool, str]:
        if self._duplicate is not None:
            return False, self._duplicate
        ended = self._thread.ident is not None and not self._thread.is_alive()
        if ended and not self._stop.is_set():
            return False, f"{self.name}: its thread ended (see the log)"
        return True, ""

    def look(self, own: str | None, found: list[Member] | None) -> None:
        """One look at the group (the thread's step; tests call it): `own` is this
        process's member id (None before it joined), `found` the group's members (None
        when the broker did not answer)."""
        if not own or found is None:
            return
        others = [m for m in found if m.member_id != own and m.known and not self._gone(m)]
        now = self._clock()
        self._first_seen = {m.member_id: self._first_seen.get(m.member_id, now) for m in others}
        stayed = [m for m in others if now - self._first_seen[m.member_id] > self._session_s]
        if stayed and self._duplicate is None:
            self._duplicate = duplicate(self._settings, stayed)
            self._on_fatal(self._duplicate)

    def _run(self) -> None:
        client_id = lease_client_id(self._settings.precise_member)
        config = client_config.consumer(self._settings, self.group, client_id)
        # It reads nothing: a pre-fetch of 64 KiB at most before its pause (so `sizing`
        # need not count it), and no offsets committed.
        consumer = self._make_consumer(
            {
                **config,
                "enable.auto.commit": False,
                "queued.max.messages.kbytes": 64,
                "queued.min.messages": 1,
            }
        )
        try:
            consumer.subscribe([self._settings.precise_done_topic])
            next_look = self._clock() + self._look_every
            while not self._stop.is_set():
                consumer.poll(0.5)  # keeps the membership; reads nothing it keeps
                assigned = consumer.assignment()
                if assigned:
                    consumer.pause(assigned)
                if self._clock() >= next_look:
                    next_look = self._clock() + self._look_every
                    try:
                        self.look(consumer.memberid(), members(self._make_admin(), [self.group]))
                    except Exception:  # asked again at the next look
                        log.exception("looking at %s", self.group)
        except Exception:
            log.exception("%s stopped", self.name)
        finally:
            consumer.close()  # a dynamic member leaves its group: a restart need not wait
