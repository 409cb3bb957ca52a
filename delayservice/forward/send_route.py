"""What the shared sender asks the mode it serves, at the few points where level and
precise records part ways.

The sender (`forward.sender.RecordSender`) sends, dead-letters and notes what it sent
for both modes; whatever a mode decides for itself is behind these calls: how a due run
goes out, how a record's envelope is read, what its markers make of it, and whether it
is sent somewhere other than its target. Each mode gives one (`level.level_route`,
`precise.precise_route`), so nothing in forward/ asks which mode it serves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from delayservice.envelope import Envelope, Headers
    from delayservice.forward.buffer import TP
    from delayservice.forward.failures import Doom
    from delayservice.levels import Level


class SendRoute(Protocol):
    def send_run(self, tp: TP, records: list[Any]) -> int:
        """Send one partition's due records in order; how many went."""
        ...

    def unsendable(self, record: Any) -> Doom | None:
        """Why a record cannot be sent at all, known before its envelope is read."""
        ...

    def envelope(self, record: Any) -> tuple[Envelope, Headers]:
        """A record's envelope and the user's headers (a copy, to append to)."""
        ...

    def due_for(self, tp: TP, record: Any, envelope: Envelope, due_ms: int) -> int | None:
        """The due time to forward with (None: it goes nowhere, decided here)."""
        ...

    def out_of_range(self, envelope: Envelope, due_ms: int, level: Level) -> tuple[str, str] | None:
        """(reason, detail) when no topic here may hold the delay the envelope asks."""
        ...

    def diverted(self, tp: TP, record: Any, envelope: Envelope, due_ms: int, level: Level) -> bool:
        """Whether the record went elsewhere than its target (done here)."""
        ...

    def waiting(self) -> bool:
        """Whether `serve` may have something to do (cheap: runs every pass)."""
        ...

    def serve(self, begin: Callable[[], None]) -> None:
        """Work the mode does between runs (`begin` runs before it produces anything)."""
        ...
