"""What a forwarder's transactions carry besides the forwards, when their offsets do not.

A level's transaction carries the level topics' offsets: a restarted or fenced
forwarder learns what committed by reading from the committed offsets. Precise mode
commits its topic's offsets when a record is on disk, long before it is due, so its
forward's transaction carries instead a record of what it delivered, and the
forwarder learns from that record what committed (`precise.delivery_log`). The
forwarder drives such a ledger through this protocol and sends no consumer offsets.
"""

from __future__ import annotations

from typing import Any, Protocol

from delayservice.forward.buffer import Runs


class TransactionLedger(Protocol):
    def learn(self) -> None:
        """Right after each init_transactions (which fenced the predecessor and ended its
        transaction): read what committed, so nothing delivered goes again. Raises
        `SendLaterError` when it cannot yet (tried again before anything is sent)."""

    def pending(self) -> bool:
        """Whether something must commit even though nothing was forwarded."""

    def write(self, producer: Any, runs: Runs) -> None:
        """Inside the open transaction, just before it commits: produce the record of
        `runs` (what it forwarded) and whatever else is pending."""

    def committed(self) -> None:
        """The transaction that `write` last went into committed."""
