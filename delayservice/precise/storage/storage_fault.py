"""Faults of precise mode's disk, told apart from faults of one record.

A record that cannot be decoded is that record's problem: it is dead-lettered and the
wheel goes on. A full disk, a failed write or fsync, or a data directory that vanished
is nobody's record's problem, and every record read while it lasts would fail the same
way: dead-lettering them would move good messages to the wrong place. So a storage
fault stops the daemon instead. Offsets of the precise topic are committed only once a
slot write is synced, so whatever was not yet durable is still in Kafka and is read
again after the restart; a file written twice is loaded once (slots drop repeated
offsets).

The slot store and the cancel log raise `StorageError` subclasses. Their public methods
also report each fault to `on_fault` (see `reported`), because the threads that use
them (intake, loader, forwarder) each handle errors their own way, and a fault must
stop the daemon whichever thread meets it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from delayservice.errors import DelayServiceError

P = ParamSpec("P")
R = TypeVar("R")


class StorageError(DelayServiceError):
    """The data directory could not be read or written; the message names the path."""


class Reporting(Protocol):
    on_fault: Callable[[StorageError], None]


S = TypeVar("S", bound=Reporting)


def ignore(_fault: StorageError) -> None:
    """The default `on_fault`: the caller sees the exception and nothing else happens."""


def reported(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """Tell the owner's `on_fault` about a storage fault, then raise it; an `OSError`
    that escaped unwrapped (a failing close) is one too."""

    @functools.wraps(method)
    def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, *args, **kwargs)
        except StorageError as fault:
            self.on_fault(fault)
            raise
        except OSError as exc:
            wrapped = StorageError(f"{method.__name__}: {exc}")
            self.on_fault(wrapped)
            raise wrapped from exc

    return wrapper
