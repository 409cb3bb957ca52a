"""Example producer for docker-compose.yml: one delayed reminder a second.

Each message asks for a random delay; the DelayProducer routes it to the level topic
that delay selects, and DelayService forwards it to EXAMPLE_TOPIC when it is due.
"""

from __future__ import annotations

import itertools
import os
import random
import time

from common import SENT_HEADER, TOPIC, ensure_topic, log, settings, stop_event

from delayservice import DelayProducer
from delayservice.kafka import client_config

DELAYS_S = [float(d) for d in os.environ.get("EXAMPLE_DELAYS", "5,10,30").split(",")]
INTERVAL_S = float(os.environ.get("EXAMPLE_INTERVAL", "1"))


def main() -> None:
    current = settings()
    ensure_topic(current)
    stop = stop_event()
    producer = DelayProducer(client_config.producer(current, "example-producer"), settings=current)
    for n in itertools.count():
        delay = random.choice(DELAYS_S)
        key = f"order-{n % 10}"
        # User headers travel untouched, so the consumer can tell how long the trip took.
        headers = [(SENT_HEADER, str(int(time.time() * 1000)).encode())]
        message_id = producer.produce(
            TOPIC, f"reminder {n}, asked {delay:.0f}s".encode(), key.encode(), headers=headers,
            delay=delay,
        )  # fmt: skip
        log.info("sent %s key=%s delay=%.0fs id=%s", n, key, delay, message_id)
        producer.poll(0)
        if stop.wait(INTERVAL_S):
            break
    producer.flush(10)


if __name__ == "__main__":
    main()
