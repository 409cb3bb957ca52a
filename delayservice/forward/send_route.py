"""What the forwarder asks the mode it serves: how a due run goes out, and the work the
mode does between runs.

The route holds the mode's decisions and walks a record through them: how its envelope
is read, what its markers make of it, whether it goes somewhere other than its target.
It calls the sender (`forward.sender.RecordSender`) for the steps both modes share
(send, dead-letter, note what was sent, sort a failure), and the sender never calls it
back, so nothing in forward/ asks which mode it serves and a record's path runs down
from the mode, not back and forth. Each mode gives one (`level.level_route`,
`precise.precise_route`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from delayservice.forward.buffer import TP


class SendRoute(Protocol):
    def send_run(self, tp: TP, records: list[Any]) -> int:
        """Send one partition's due records in order; how many went."""
        ...

    def send_one(self, tp: TP, record: Any, now_ms: int) -> None:
        """Everything `send_run` does not send as it is, through the sender's steps
        (`RecordSender.doom_of`, `target_check`, `forward`, `dead_letter`, `failed`),
        with the mode's decisions between them."""
        ...

    def waiting(self) -> bool:
        """Whether `serve` may have something to do (cheap: runs every pass)."""
        ...

    def serve(self, begin: Callable[[], None]) -> None:
        """Work the mode does between runs (`begin` runs before it produces anything)."""
        ...
