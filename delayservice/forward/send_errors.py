"""The two ways a send stops short of an outcome for its record: the producer cannot go
on (`ForwarderFatalError`), or the record cannot go now (`SendLaterError`).

Apart from the sender because the forwarder, its transaction and precise mode's
delivery raise and catch them too, and none of them needs the sender to do so.
"""

from __future__ import annotations

from typing import Final

from confluent_kafka import KafkaError

from delayservice.errors import DelayServiceError


class ForwarderFatalError(DelayServiceError):
    """The producer cannot go on: a new one replaces it, or (`fenced`: another live
    instance has its transactional id, or failures keep coming) the daemon stops."""

    def __init__(self, message: str, *, fenced: bool = False) -> None:
        super().__init__(message)
        self.fenced = fenced


FENCED: Final = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED})


def producer_failed(error: KafkaError, what: str) -> ForwarderFatalError:
    """The error for a producer that hit `error` (fatal) while doing `what`."""
    fenced = error.code() in FENCED
    hint = (
        " (a newer producer took its transactional id: another live process with the same "
        "instance_name, or the coordinator ending a transaction left open past its timeout)"
        if fenced
        else ""
    )
    return ForwarderFatalError(f"{what}: {error.str()}{hint}", fenced=fenced)


class SendLaterError(DelayServiceError):
    """A record that cannot be sent now; its partition goes back to the buffer from it."""

    def __init__(self, why: str) -> None:
        super().__init__(why, retriable=True)
