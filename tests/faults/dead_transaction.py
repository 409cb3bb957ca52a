"""Run as a process: send offsets to a transaction for a group's partitions, then die by
SIGKILL, leaving those offsets pending (unstable) until the broker aborts the
transaction at its timeout. What a member killed between `send_offsets_to_transaction`
and the end of its commit leaves behind.

    python -m tests.faults.dead_transaction BOOTSTRAP GROUP TOPIC OFFSET TIMEOUT_MS P [P ...]
"""

from __future__ import annotations

import os
import signal
import sys

from confluent_kafka import Consumer, Producer, TopicPartition


def main() -> None:
    bootstrap, group, topic, offset, timeout_ms, *partitions = sys.argv[1:]
    metadata = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"dead-{group}",
            "transaction.timeout.ms": int(timeout_ms),
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    offsets = [TopicPartition(topic, int(p), int(offset)) for p in partitions]
    producer.send_offsets_to_transaction(offsets, metadata.consumer_group_metadata(), 30)
    print("pending", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
