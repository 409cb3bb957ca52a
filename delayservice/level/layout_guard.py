"""Never both worker layouts at once.

The two layouts (`level.layout`) read the same level partitions in different consumer
groups, with different transactional ids: an instance of each running side by side
both forward every record, and neither fences the other, so exactly-once readers see
duplicates (1,776 of 2,000 level records in one run on a real broker). So a process
does not start its level workers while the other layout's groups have members, and
says which.

A member of a group is not proof of a live process: a static member (every level
worker is one) does not leave its group when it stops or is killed, it stays until
its session times out. So start-up waits, not ready, for the other layout's members to
go, for `WAIT_SESSIONS` of its own session timeouts (instances share their settings),
and refuses only if one is still there after that: by then it heartbeats.

What remains: two processes of different layouts started within a second or two of
each other each look before the other's consumer has joined, and both start. The
`LayoutWatch` looks again while the daemon runs: readiness goes red and an ERROR names
the other layout's members for as long as they are there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Final

from delayservice.errors import ConfigError
from delayservice.kafka.group_members import GroupWatch, Member, members, wait_until_empty
from delayservice.level import layout
from delayservice.settings import Settings

log = logging.getLogger(__name__)

WAIT_SESSIONS: Final = 3
"""How many session timeouts start-up waits for the other layout's members to go."""
WATCH_EVERY_S: Final = 10.0
"""How often a running daemon looks for the other layout's members."""


def other_layout(settings: Settings) -> str:
    return layout.PER_LEVEL if settings.level_workers == layout.SHARED else layout.SHARED


def other_groups(settings: Settings) -> list[str]:
    """The consumer groups the other layout's workers of this process's levels join."""
    return [plan.group_id for plan in layout.workers(settings, other_layout(settings))]


def conflict(settings: Settings, live: list[Member]) -> str:
    """One line: which layout runs where, and what to do."""
    return (
        f"level_workers is {settings.level_workers!r} but the {other_layout(settings)!r} "
        f"layout's consumer groups have live members ({'; '.join(map(str, live))}): both "
        "layouts at once forward every record twice; stop every instance before changing "
        "level_workers (docs/operations.md, Changing the worker layout)"
    )


def wait_until_alone(
    admin: Any, settings: Settings, stop: threading.Event, *, wait_s: float | None = None
) -> None:
    """Return once no group of the other layout has a member (or a stop is asked for);
    raise ConfigError naming them if some are still there after `wait_s` (by default
    `WAIT_SESSIONS` session timeouts). The daemon is not ready meanwhile."""
    budget = wait_s if wait_s is not None else WAIT_SESSIONS * settings.session_timeout_s
    live = wait_until_empty(
        admin, other_groups(settings), stop, budget, "the other worker layout's members"
    )
    if live:
        raise ConfigError("level_workers", conflict(settings, live))


class LayoutWatch(GroupWatch):
    """While the daemon runs, looks for members of the other layout's groups (two
    processes of different layouts started at the same moment both got past
    `wait_until_alone`): readiness red, and an ERROR, while there are any. The other
    layout's members a stop left behind go within a session; that is the first look."""

    name = "layout-watch"

    def __init__(
        self,
        settings: Settings,
        admin_factory: Callable[[], Any],
        every_s: float = WATCH_EVERY_S,
    ) -> None:
        self._settings = settings
        self._admin_factory = admin_factory
        self._every = every_s
        self._groups = other_groups(settings)
        self._live: list[Member] = []
        super().__init__()

    def health(self) -> tuple[bool, str]:
        live = self._live
        if live:
            return False, conflict(self._settings, live)
        return True, ""  # nothing to add to a ready daemon's line

    def look(self, admin: Any) -> None:
        """One look (the thread's step; tests call it)."""
        live = members(admin, self._groups)
        if live is None:
            return  # keep what was last seen
        if live and live != self._live:
            log.error("%s", conflict(self._settings, live))
        elif self._live and not live:
            log.info("the other worker layout's members are gone")
        self._live = live

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:  # a client of its own each time, as `layout.OtherLayout` asks
                self.look(self._admin_factory())
            except Exception:  # a look that failed is asked again; never the thread's end
                log.exception("looking for the other worker layout's members")
