"""The calls between level mode's route and its markers, both ways.

The route hands each record a marker may concern to the markers (`decide`), and lets
them serve their answers between runs (`serve`); the markers carry their decisions out
through the route (a copy republished, an answer produced in the open interval, a
record withdrawn or rerouted). Each side holds the other as an argument, with no
import to follow, so the calls are named here: a reader sees them in one place, and
mypy checks that `level.markers.actions.WorkerMarkers` and `level.level_route.LevelRoute`
give them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from delayservice.envelope import Envelope
    from delayservice.forward.buffer import TP
    from delayservice.forward.failures import Key

OnDelivery = Callable[[Any, Any], None]


class MarkerSender(Protocol):
    """What the markers do through the sender (`LevelRoute`), in the open interval."""

    def republish(
        self,
        tp: TP,
        record: Any,
        topic: str,
        partition: int | None,
        extra: list[tuple[str, Any]],
        on_delivery: OnDelivery | None = None,
    ) -> None: ...

    def withdraw(self, spot: Key, outcome: str) -> None: ...

    def rerouted(self, spot: Key, topic: str) -> None: ...

    def partition_count(self, topic: str) -> int: ...

    def envelope_of(self, record: Any) -> Envelope | None: ...

    def answer(self, topic: str, value: bytes, key: bytes, on_delivery: OnDelivery) -> None: ...


class MarkerRoute(Protocol):
    """Level mode's markers as its route meets them (`level_routes(markers=)`)."""

    def screen(self, tp: TP, records: list[Any]) -> list[int] | None: ...

    def recall(self, tp: TP, record: Any, message_id: str, due_ms: int) -> None: ...

    def has(self, message_id: str) -> bool: ...

    def decide(
        self, tp: TP, record: Any, envelope: Envelope, due_ms: int, sender: MarkerSender
    ) -> int | None: ...

    def waiting(self) -> bool: ...

    def serve(self, sender: MarkerSender, begin: Callable[[], None] = ...) -> None: ...
