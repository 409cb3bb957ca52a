"""Errors the timers raise, under the package's one root class.

A timer refuses work in two situations and the caller must tell them apart: it is
full (back off and try again later) or it is stopped (the work must go elsewhere).
"""

from __future__ import annotations

from delayservice.errors import DelayServiceError


class TimerRejectedError(DelayServiceError):
    """A timer already holds its configured maximum of pending timeouts (Netty's
    `RejectedExecutionException`). Retriable: room frees up as timeouts fire."""

    def __init__(self, pending: int, limit: int) -> None:
        super().__init__(
            f"number of pending timeouts ({pending}) is greater than or equal to the maximum "
            f"allowed pending timeouts ({limit})",
            retriable=True,
        )
        self.pending = pending
        self.limit = limit


class TimerClosedError(DelayServiceError):
    """The timer was stopped. Accepting the task would lose it silently, so it is refused."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} is stopped and accepts no new tasks")


class TimerStateError(DelayServiceError):
    """A call that would deadlock or corrupt the timer, such as stopping it from its own worker."""
