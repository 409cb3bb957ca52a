"""Two copies, exactly-once: the replica forwards the owner's records under the owner's
transactional id, so the two can never both commit a delivery.

Each member replicates the partitions of one other (`placement`: the member before
it). Its copies of them go out through a forwarder of their own, whose producer uses
that owner's transactional id and initialises only when a copy the owner has not
covered comes due (`SharedId.lazy`): the init fences the owner and ends its open
transaction, committed or aborted. The forwarder then learns what committed under the
id (its own earlier records, `DeliveryLog`; the owner's, through the progress reader,
`Progress.read_past`) and looks at the copies again before it sends them. An owner that
comes back is fenced at its next commit; its new producer's init fences the replica in
turn, and learns the same way what the replica delivered. The replica, fenced, holds
its copies for the takeover delay, so the owner goes on first; a copy still uncovered
after that takes over again.
"""

from __future__ import annotations

from delayservice.forward.forwarder import Forwarder
from delayservice.precise.delivery_log import DeliveryLog
from delayservice.precise.placement import Placement


def replicated_owner(placement: Placement) -> int:
    """The member whose partitions this member holds the replica of."""
    return (placement.member - 1) % placement.members


class Takeover:
    """The wheel's handle on the takeover forwarder (`wheel_state.Takeover`)."""

    def __init__(self, delivered: DeliveryLog) -> None:
        self.delivered = delivered
        self.forwarder: Forwarder | None = None
        """Set once built: it takes from the wheel's takeover buffer."""

    def ready(self) -> float:
        forwarder = self.forwarder
        if forwarder is None:
            return 1.0
        return forwarder.ensure_transaction()
