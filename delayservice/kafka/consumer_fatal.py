"""Whether a consumer has gone fatal, asked without serving its queue.

librdkafka sets a consumer's fatal error (a static member fenced by another with the
same `group.instance.id`) on its own thread, and tells the application only through
the consumer's queue: the next `consume()` returns it. A thread that keeps asking
`committed()` serves no queue meanwhile (`level.start_offsets`: asking until an open
transaction lets go of the offsets). Once fenced the client drops its coordinator, and
`committed()` then times out for as long as it is asked: row 18 exactly-once stalled
that way after a broker freeze (docs/faults.md).

A commit is refused with `_FATAL` before librdkafka looks at anything else, and one
that names no valid offset is refused with `_NO_OFFSET` without a request: committing
`OFFSET_INVALID` asks the question and commits nothing.
"""

from __future__ import annotations

import functools

from confluent_kafka import OFFSET_INVALID, KafkaError, TopicPartition

from delayservice.kafka.client_errors import error_of, raised_by
from delayservice.kafka.client_seam import ConsumerClient


def fatal_error(consumer: ConsumerClient, topic: str, partition: int) -> KafkaError | None:
    """The `_FATAL` error the consumer refuses a commit with, or None while it is usable
    (or whatever else the probe meets: only a sure answer counts)."""
    probe = [TopicPartition(topic, partition, OFFSET_INVALID)]
    raised = raised_by(functools.partial(consumer.commit, offsets=probe, asynchronous=False))
    error = error_of(raised) if raised is not None else None
    if error is not None and error.code() == KafkaError._FATAL:
        return error
    return None
