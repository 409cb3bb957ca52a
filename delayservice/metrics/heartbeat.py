"""When a loop that should keep coming round last did, for readiness.

A thread can be alive and still not move: a client call that never returns within its
timeout, a hand-over that waits on a forwarder that is itself stuck. `is_alive()` says
nothing about that, and the forwarders' own stall check waits out the retry budget
(minutes). Each loop beats once per turn; readiness says which one stood still for
longer than `STUCK_S`, and for how long, so an operator reads the reason on /readyz.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

STUCK_S: Final = 30.0
"""How long a loop may take over one turn before readiness turns red: longer than any
wait a turn makes on purpose in steady operation (a poll, a flush, a commit), shorter
than the alerts' windows."""


class Heartbeat:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.at = clock()
        """When the loop last came round (clock seconds); a float, read whole."""

    def beat(self) -> None:
        self.at = self._clock()

    def still_s(self) -> float:
        """How long since the last beat."""
        return self._clock() - self.at
