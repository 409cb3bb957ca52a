"""How long after `commit_transaction` returns a transaction's records become readable.

The broker writes a transaction's commit markers after the commit call returns, one
partition after another; until a partition has its marker, its last stable offset (the
end a read_committed client is told) stands before the transaction's records. The
daemon's markers reader relies on which end it reads to (docs/cancel-and-reschedule.md,
"A move and a change of owner"), so this measures the window on a real broker:

- `stable end behind`: transactions whose record's partition still ended, stably,
  before it when asked right after the commit returned, and for how long;
- `offsets first`: transactions whose consumer-group offsets (sent in the same
  transaction, asked as a read_committed member asks: stable offsets required) were
  already free while the record's partition still ended before it.

    python benchmarks/commit_marker_lag.py [--commits 40] [--hogs 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).parent))
from cpu_hogs import cpu_hogs
from forwarding import broker


def _end(consumer: Consumer, tp: TopicPartition) -> int:
    high: int = consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]
    return high


def measure(bootstrap: str, commits: int) -> tuple[list[float], int]:
    """(how long each stable end stood behind, in ms; how many commits freed the
    group's offsets while the record's partition still stood behind)."""
    tag = uuid.uuid4().hex[:8]
    data, source = f"commit-lag-{tag}", f"commit-lag-{tag}-source"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for done in admin.create_topics([NewTopic(data, 1, 1), NewTopic(source, 1, 1)]).values():
        done.result(30)
    common = {"bootstrap.servers": bootstrap}
    producer = Producer({**common, "transactional.id": f"commit-lag-{tag}"})
    producer.init_transactions(30)
    member = Consumer(
        {**common, "group.id": f"commit-lag-{tag}", "isolation.level": "read_committed"}
    )
    stable = Consumer({**common, "group.id": f"s-{tag}", "isolation.level": "read_committed"})
    log_end = Consumer({**common, "group.id": f"l-{tag}", "isolation.level": "read_uncommitted"})
    tp, source_tp = TopicPartition(data, 0), TopicPartition(source, 0)
    behind_ms: list[float] = []
    offsets_first = 0
    try:
        for number in range(1, 2 * commits + 1):
            producer.begin_transaction()
            producer.produce(data, b"x")
            producer.flush(30)
            offsets = [TopicPartition(source, 0, number)]
            producer.send_offsets_to_transaction(offsets, member.consumer_group_metadata(), 30)
            producer.commit_transaction(30)
            if number % 2:  # the stable end, asked at once
                end = _end(log_end, tp)
                began = time.monotonic()
                if _end(stable, tp) < end:
                    while _end(stable, tp) < end:
                        pass
                    behind_ms.append((time.monotonic() - began) * 1000)
            else:  # first the group's offsets, then the stable end
                while member.committed([source_tp], timeout=10)[0].offset != number:
                    pass
                if _end(stable, tp) < _end(log_end, tp):
                    offsets_first += 1
    finally:
        for consumer in (member, stable, log_end):
            consumer.close()
    return behind_ms, offsets_first


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=40, help="transactions per question")
    parser.add_argument("--hogs", type=int, default=0, help="processes spinning a core beside")
    parser.add_argument("--bootstrap", help="an existing broker instead of a local one")
    args = parser.parse_args()
    if args.commits < 1:
        parser.error("--commits must be at least 1")
    with broker(args.bootstrap) as bootstrap, cpu_hogs(args.hogs):
        behind, offsets_first = measure(bootstrap, args.commits)
    n = args.commits
    print(f"stable end behind right after the commit: {len(behind)} of {n} transactions", end="")
    if behind:
        print(
            f", for {min(behind):.1f}-{max(behind):.1f} ms (median {statistics.median(behind):.1f})"
        )
    else:
        print()
    still = "group offsets free while the record's partition still stood behind"
    print(f"{still}: {offsets_first} of {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
