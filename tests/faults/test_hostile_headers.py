"""Hostile bytes the Python client itself cannot take, written by a non-Python client.

Records are written through librdkafka's C API (`tests.kafka.raw_producer`), which can
put any bytes in a header name, into a level topic, the precise topic and its `_done`
progress topic, between good records sent through `DelayProducer`. The daemon runs as a
real `delayservice run` subprocess (a segfault shows as its death, not the test's), once
per guarantee, with precise mode on: two replicas at-least-once, so the progress reader
runs too; one under exactly-once (once for every record needs one copy), where the delivery log
reads `_done` when the forwarder takes over. Each kind of record and what the daemon does with it:

- a header name that is not UTF-8: confluent-kafka cannot decode it (its `headers()`
  raises once and segfaults on the next call), so the envelope is unknown: dead-lettered
  at once with reason `unreadable_headers`, its key and value kept, no headers but the
  `dlq-*` ones;
- an empty name; 10,000 headers; a 900 KB header value; a value and key that are not
  UTF-8: read as they are and forwarded byte for byte;
- a name with a NUL in it: the client reads names as C strings, so it arrives cut at the
  NUL and is forwarded under the shortened name (nothing in Python can see the rest).

On `_done` the progress reader reads only values, so such headers change nothing there;
the daemon must stay alive and ready. The good records around each bad one all arrive.
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.faults.harness import Fleet, Reader, Rec, wait_until
from tests.kafka.raw_producer import RawHeader, RawProducer

pytestmark = pytest.mark.kafka

SEED = 20_020
DELAY_MS = 1000
BIG = random.Random(SEED).randbytes(900 * 1024)


class Kind:
    """One hostile record: its user headers, key and value as written, and what a
    forwarded copy must carry (None: it must be dead-lettered as unreadable)."""

    def __init__(
        self,
        headers: list[RawHeader],
        *,
        key: bytes = b"k",
        value: bytes = b"v",
        forwarded_headers: list[tuple[str, bytes | None]] | None,
    ) -> None:
        self.headers = headers
        self.key = key
        self.value = value
        self.forwarded_headers = forwarded_headers


KINDS: dict[str, Kind] = {
    "name-not-utf8": Kind([(b"trace", b"1"), (b"\xff\xfebad", b"x")], forwarded_headers=None),
    "empty-name": Kind([(b"", b"e")], forwarded_headers=[("", b"e")]),
    "name-with-nul": Kind([(b"a\x00b", b"z")], forwarded_headers=[("a", b"z")]),
    "10000-headers": Kind(
        [(b"h%d" % i, b"v") for i in range(10_000)],
        forwarded_headers=[(f"h{i}", b"v") for i in range(10_000)],
    ),
    "900kb-header-value": Kind([(b"big", BIG)], forwarded_headers=[("big", BIG)]),
    "value-and-key-not-utf8": Kind(
        [], key=b"\xc3\x28\xff", value=b"\xff\xfe\x00\x80", forwarded_headers=[]
    ),
}


def _envelope(target: str, message_id: str) -> list[RawHeader]:
    """The envelope as `DelayProducer` writes it, after the user's headers."""
    return [
        (b"delay-v", b"1"),
        (b"delay-target", target.encode()),
        (b"delay-ms", str(DELAY_MS).encode()),
        (b"delay-id", message_id.encode()),
    ]


def _user_headers(record: Rec) -> list[tuple[str, bytes | None]]:
    return [(n, v) for n, v in record.headers if not n.startswith("delay-")]


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_hostile_header_bytes_never_stop_the_daemon(
    testbed: Any, tmp_path: Path, guarantee: str
) -> None:
    tag = testbed.tag
    settings = testbed.settings(
        levels="1s",
        partitions=1,
        guarantee=guarantee,
        precise=True,
        precise_topic=f"hh-precise-{tag}",
        precise_members=2,
        replicas=2 if guarantee == "at-least-once" else 1,
        data_dir=tmp_path / "data",
    )
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(
        f"hh-target-{tag}", 2, {"message.timestamp.type": "LogAppendTime"}
    )
    level_topic = settings.level_set().levels[0].topic
    fleet = Fleet(settings, tmp_path)
    daemon = fleet.spawn(
        f"hh-{tag}",
        {"DELAYSERVICE_PRECISE_MEMBER": "0", "DELAYSERVICE_DATA_DIR": str(tmp_path / "data")},
    )
    try:
        assert wait_until(lambda: daemon.ready() or not daemon.alive(), 60), daemon.log_tail()
        assert daemon.alive(), daemon.log_tail()

        good_ids: set[str] = set()
        hostile: dict[str, tuple[str, Kind]] = {}  # delay-id -> (where, kind name)
        level = testbed.producer(settings)
        exact = testbed.producer(settings)
        with RawProducer(testbed.bootstrap) as raw:
            for kind in KINDS.values():  # read by the progress reader, first
                raw.produce(settings.precise_done_topic, kind.value, kind.key, kind.headers, 0)
            raw.flush()
            for name, kind in KINDS.items():
                for where, topic in (("level", level_topic), ("precise", settings.precise_topic)):
                    precision = "exact" if where == "precise" else "level"
                    producer = exact if where == "precise" else level
                    before = producer.produce(
                        target, b"good", key=b"g", delay=DELAY_MS / 1000, precision=precision
                    )
                    producer.flush(10)
                    message_id = f"{uuid.uuid4().hex}-p0"
                    headers = [*kind.headers, *_envelope(target, message_id)]
                    raw.produce(topic, kind.value, kind.key, headers, 0)
                    raw.flush()
                    after = producer.produce(
                        target, b"good", key=b"g", delay=DELAY_MS / 1000, precision=precision
                    )
                    good_ids.update((before, after))
                    hostile[message_id] = (where, name)
        assert level.flush(10) == 0
        assert exact.flush(10) == 0

        dead_kinds = sum(1 for _, k in hostile.values() if KINDS[k].forwarded_headers is None)
        reader = Reader(testbed.bootstrap, [target, settings.dead_letter_topic])

        def arrived() -> tuple[dict[str, Rec], list[Rec]]:
            reader.catch_up(timeout=5)
            forwarded = {(r.header("delay-id") or b"").decode(): r for r in reader.records[target]}
            return forwarded, reader.records[settings.dead_letter_topic]

        def complete() -> bool:
            forwarded, dead = arrived()
            want = good_ids | {m for m, (_, k) in hostile.items() if KINDS[k].forwarded_headers}
            return want <= forwarded.keys() and len(dead) >= dead_kinds

        assert wait_until(lambda: complete() or not daemon.alive(), 90), daemon.log_tail()
        assert fleet.unexpected_exits() == []
        forwarded, dead = arrived()
        reader.close()

        for message_id, (where, name) in hostile.items():
            kind = KINDS[name]
            if kind.forwarded_headers is None:
                assert message_id not in forwarded, f"{where} {name} was forwarded"
                continue
            copy = forwarded[message_id]
            assert (copy.key, copy.value) == (kind.key, kind.value), f"{where} {name}"
            assert _user_headers(copy) == kind.forwarded_headers, f"{where} {name}"
        assert len(dead) == dead_kinds, [r.header("dlq-reason") for r in dead]
        for record in dead:
            assert record.header("dlq-reason") == b"unreadable_headers"
            assert (record.key, record.value) == (
                KINDS["name-not-utf8"].key,
                KINDS["name-not-utf8"].value,
            )
            assert all(n.startswith("dlq-") for n, _ in record.headers), record.headers
            assert record.header("dlq-origin-topic") in (
                level_topic.encode(),
                settings.precise_topic.encode(),
            )
        origins = {r.header("dlq-origin-topic") for r in dead}
        assert origins == {level_topic.encode(), settings.precise_topic.encode()}
        assert daemon.alive(), daemon.log_tail()
        assert daemon.ready(), daemon.log_tail()
    finally:
        fleet.stop_all()
        assert fleet.unexpected_exits() == []
