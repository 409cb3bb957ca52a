"""Example consumer for docker-compose.yml: reads the real topic and shows each delay.

A plain confluent-kafka consumer: nothing here knows about DelayService except the
`delay-due-ms` header the daemon keeps on forwarded records. The producer's own
`example-sent-ms` header shows how long the whole trip took.
"""

from __future__ import annotations

import time

from common import SENT_HEADER, TOPIC, ensure_topic, log, settings, stop_event
from confluent_kafka import Consumer

from delayservice.envelope import H_DUE_MS


def main() -> None:
    current = settings()
    ensure_topic(current)
    stop = stop_event()
    consumer = Consumer(
        {
            **current.kafka,
            "bootstrap.servers": current.bootstrap_servers,
            "group.id": "example-consumer",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([TOPIC])
    try:
        while not stop.is_set():
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error() is not None:
                log.warning("%s", message.error())
                continue
            headers = dict(message.headers() or [])
            now_ms = time.time() * 1000
            sent_ms = int(headers.get(SENT_HEADER) or now_ms)
            due_ms = int(headers.get(H_DUE_MS) or now_ms)
            log.info(
                "got %s (key %s): took %.2fs, %.0f ms after its due time",
                (message.value() or b"").decode(),
                (message.key() or b"").decode(),
                (now_ms - sent_ms) / 1000,
                now_ms - due_ms,
            )
    finally:
        consumer.close()


if __name__ == "__main__":
    main()
