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

import logging
from typing import Final

from delayservice.forward.forwarder import Forwarder
from delayservice.precise.delivery.delivery_log import DeliveryLog
from delayservice.precise.placement import Placement

log = logging.getLogger(__name__)

CATCH_UP_WAIT_S: Final = 2.0
"""How long copies that look uncovered wait for the progress reader to read what was
written before them, before they fence the owner anyway. A member thawed after a
freeze, or started, finds its reader seconds behind the owner's word, and every copy
it holds looks uncovered; fencing a live owner for them costs it its open transaction.
An owner frozen with a transaction open holds the reader back (read_committed) until
the fence, so the wait is bounded."""


def replicated_owner(placement: Placement) -> int:
    """The member whose partitions this member holds the replica of."""
    return (placement.member - 1) % placement.members


class Takeover:
    """The wheel's handle on the takeover forwarder (`wheel_state.Takeover`)."""

    def __init__(self, delivered: DeliveryLog) -> None:
        self.delivered = delivered
        self.forwarder: Forwarder | None = None
        """Set once built: it takes from the wheel's takeover buffer."""

    def catch_up(self) -> None:
        """Wait, at most `CATCH_UP_WAIT_S`, until the progress reader has read the done
        topic to where it ends now. Never raises: the init and learn that follow decide
        what is covered in any case; this only spares the owner needless fences."""
        delivered = self.delivered
        read_past = delivered.others_read
        if read_past is None:
            return
        try:
            end = delivered.end()
        except Exception as exc:
            log.debug("takeover: the done topic's end not known: %s", exc)
            return
        read_past(end, CATCH_UP_WAIT_S)

    def ready(self) -> float:
        forwarder = self.forwarder
        if forwarder is None:
            return 1.0
        return forwarder.ensure_transaction()
