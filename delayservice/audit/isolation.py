"""Which records of a topic the audit sees: Kafka's isolation level, per side.

A record written inside a Kafka transaction is in the log before the transaction ends,
and stays there if it is aborted. A read_committed consumer sees it only once its
transaction commits, and never if it aborts; a read_uncommitted one sees every record.
With `guarantee = "exactly-once"` the daemon forwards inside transactions, and a forward
it had to redo after an abort leaves an aborted copy behind: exactly once holds for a
read_committed reader, and a read_uncommitted reader sees that copy as a duplicate.
So the audit reads the target topics as the consumer it speaks for would, and says which.

The delay topics are always read as the daemon reads them (its consumer's
`isolation.level`: read_committed, which the settings may not change): a record of an
aborted transaction there was never accepted, and counting it would report a message
nobody sent as missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from delayservice.audit import AuditError
from delayservice.errors import ConfigError
from delayservice.kafka import client_config
from delayservice.settings import Settings

KEY = "isolation.level"


class Isolation(StrEnum):
    READ_COMMITTED = "read_committed"
    READ_UNCOMMITTED = "read_uncommitted"


DEFAULT = Isolation.READ_COMMITTED
"""What exactly-once promises to, and what at-least-once loses nothing by: without
transactions on the target topics both levels see the same records."""

MEANING = {
    Isolation.READ_COMMITTED: "committed transactions only, as an exactly-once consumer reads",
    Isolation.READ_UNCOMMITTED: "every record, aborted transactions' copies included",
}


class IsolationOptionError(AuditError, ConfigError):
    """An isolation level given where the audit sets its own (exit 2)."""


def of_daemon(settings: Settings) -> Isolation:
    """The isolation level of the daemon's own consumers of the delay topics."""
    config = client_config.consumer(settings, group_id="audit", client_id="audit")
    try:
        return Isolation(str(config.get(KEY, DEFAULT)).strip().lower())
    except ValueError:
        raise IsolationOptionError(
            f"consumer.{KEY}", "must be read_committed or read_uncommitted"
        ) from None


def refuse_explicit(kafka_options: Mapping[str, str]) -> None:
    """An explicit `--kafka-option isolation.level` would silently decide for both sides;
    the audit's own choice per side is the one that keeps the counts meaningful."""
    if any(key.removeprefix("kafka.") == KEY for key in kafka_options):
        raise IsolationOptionError(
            f"--kafka-option {KEY}",
            "the audit sets it: use --isolation for the target topics; the delay topics "
            "are read as the daemon reads them",
        )


def header(targets: Isolation, delay: Isolation) -> str:
    """The report's first line: how each side was read."""
    return (
        f"target topics read {targets.value} ({MEANING[targets]}); "
        f"delay topics read {delay.value}, as the daemon reads them"
    )
