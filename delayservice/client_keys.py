"""The librdkafka keys the daemon owns: the `kafka`, `consumer` and `producer` settings
may not set them.

Each one, set otherwise, breaks a promise (a record lost, read twice, reordered or sent
where its key does not belong) or is set by the daemon itself per client, so a value
from the settings would be dropped without a word. Refusing at start-up says so in one
line; the client configs (`kafka.client_config`) still set them last. A value that
means what the daemon sets anyway (`acks = "all"`) is taken, compared as librdkafka
reads it (case and surrounding spaces ignored). Every spelling librdkafka takes counts:
its aliases (`request.required.acks`), topic keys with the `topic.` prefix, and topic
keys nested under `default.topic.config`.

Kept apart from `kafka/` so that loading settings never imports the Kafka client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final


@dataclass(frozen=True)
class OwnedKey:
    name: str
    why: str
    """What setting it would do, as a clause after `KEY = VALUE`."""
    allowed: tuple[str, ...] = ()
    """Values (lower case) that mean what the daemon sets; none: any value is refused."""
    aliases: tuple[str, ...] = ()
    instead: str = ""
    """What to set instead, when not the first allowed value."""


_FALSE: Final = ("false", "f", "0")
_TRUE: Final = ("true", "t", "1")
_CALLBACK_WHY: Final = "is a callback, which only code can give (the daemon gives its own)"

OWNED: Final[tuple[OwnedKey, ...]] = (
    # Consumers: what is read, and what is committed.
    OwnedKey(
        "auto.offset.reset",
        "would skip the records of a partition with no commit or an offset out of range: "
        "they would be lost",
        ("earliest", "smallest", "beginning"),
    ),
    OwnedKey(
        "isolation.level",
        "would read records of aborted transactions: forwards, markers and replies that were "
        "never sent, and no more exactly-once",
        ("read_committed",),
    ),
    OwnedKey(
        "enable.auto.commit",
        "would commit offsets of records read but not yet forwarded: lost in a crash",
        _FALSE,
        aliases=("auto.commit.enable",),
    ),
    OwnedKey(
        "enable.auto.offset.store",
        "would mark records consumed before they are forwarded; the daemon commits only what "
        "it forwarded",
        _FALSE,
    ),
    OwnedKey(
        "group.id",
        "would put every worker and reader of the daemon in one group; the group_id setting "
        "names them",
    ),
    OwnedKey(
        "group.instance.id",
        "would give every worker the same static member id, so they fence each other out; "
        "the instance_name setting names them",
    ),
    OwnedKey(
        "partition.assignment.strategy",
        "would change how partitions are handed over on a rebalance; the hand-over on "
        "revoke is built on incremental (cooperative) rebalancing",
        ("cooperative-sticky",),
    ),
    OwnedKey(
        "group.protocol",
        "would change how partitions are handed over on a rebalance; static membership and "
        "the hand-over on revoke are built on the classic protocol",
        ("classic",),
    ),
    OwnedKey(
        "allow.auto.create.topics",
        "would create a topic a record names by mistake instead of dead-lettering the record",
        _FALSE,
    ),
    # Producers: what is durable, once, and in order.
    OwnedKey(
        "acks",
        "would let one broker acknowledge a forward that a leader change then loses, after "
        "its offset was committed",
        ("all", "-1"),
        aliases=("request.required.acks",),
    ),
    OwnedKey(
        "enable.idempotence",
        "would let a retried forward be written twice or out of order",
        _TRUE,
    ),
    OwnedKey(
        "max.in.flight.requests.per.connection",
        "would let an idempotent producer reorder forwards (it keeps order with at most 5 "
        "requests in flight)",
        ("1", "2", "3", "4", "5"),
        aliases=("max.in.flight",),
        instead="at most 5",
    ),
    OwnedKey(
        "queuing.strategy",
        "would send a partition's records newest first",
        ("fifo",),
    ),
    OwnedKey(
        "partitioner",
        "would put a keyed record whose envelope names no partitioner on another partition "
        "than a Java client would (murmur2)",
        ("murmur2_random",),
    ),
    OwnedKey(
        "transactional.id",
        "would make every producer transactional under one id: they would fence each other, "
        'and at least once none could send; guarantee = "exactly-once" names one per worker',
    ),
    OwnedKey(
        "transaction.timeout.ms",
        "is set by the daemon on its transactional producers, the only ones it affects "
        '(guarantee = "exactly-once"; 10 s, so an abandoned transaction holds read_committed '
        "readers back briefly)",
    ),
    OwnedKey(
        "delivery.report.only.error",
        "is set by the daemon per producer: the ones that commit after a flush need only "
        "failures, the others every report",
    ),
    *(
        OwnedKey(name, _CALLBACK_WHY)
        for name in (
            "error_cb",
            "throttle_cb",
            "stats_cb",
            "oauth_cb",
            "on_delivery",
            "on_commit",
            "logger",
            "dr_cb",
            "dr_msg_cb",
        )
    ),
)

CLIENT_SETTINGS: Final = ("kafka", "consumer", "producer")
TOPIC_PREFIX: Final = "topic."
"""librdkafka takes any topic key on a client's config with this prefix."""
NESTED: Final = "default.topic.config"
"""confluent-kafka's dict of topic keys (deprecated there); settings take strings only."""

_BY_NAME: Final = {name: key for key in OWNED for name in (key.name, *key.aliases)}


def owned(name: str) -> OwnedKey | None:
    """The owned key `name` spells, through an alias or the `topic.` prefix."""
    found = _BY_NAME.get(name)
    if found is None and name.startswith(TOPIC_PREFIX):
        found = _BY_NAME.get(name.removeprefix(TOPIC_PREFIX))
    return found


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def refusal(name: str, value: str) -> str | None:
    """Why `name = value` may not be set, in one line, or None when it may."""
    key = owned(name)
    if key is None or value.strip().lower() in key.allowed:
        return None
    spelled = name if name == key.name else f"{name} ({key.name})"
    instead = key.instead or (repr(key.allowed[0]) if key.allowed else "")
    only = f"remove it or set {instead}" if instead else "remove it"
    return f"{spelled} = {_shown(value)} {key.why}; the daemon owns this key: {only}"


def nested_refusal(value: Any) -> str | None:
    """Why a `default.topic.config` entry may not be set: an owned key inside it, else
    the nesting itself (settings hold strings, and librdkafka takes topic keys flat)."""
    if isinstance(value, Mapping):
        for name, inner in value.items():
            if isinstance(name, str) and isinstance(inner, str):
                reason = refusal(name, inner)
                if reason is not None:
                    return f"{NESTED}: {reason}"
    return (
        f"{NESTED} = {_shown(value)} nests topic keys; give them flat instead "
        '(e.g. "message.timeout.ms" = "60000")'
    )


def refusal_in(config: Any) -> str | None:
    """The first key of a `kafka`, `consumer` or `producer` setting (as given, before
    its type is checked) that may not be set, and why; None when there is none."""
    if not isinstance(config, Mapping):
        return None
    for name, value in config.items():
        if name == NESTED:
            return nested_refusal(value)
        if isinstance(name, str) and isinstance(value, str):
            reason = refusal(name, value)
            if reason is not None:
                return reason
    return None
