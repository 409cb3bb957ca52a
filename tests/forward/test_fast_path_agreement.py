"""The level's fast path (`fast_path.hold_run`, interpreted and compiled) checks the
envelope inline when it admits a record, a copy of `envelope.plain_tail`'s checks kept
there for speed (a call per record costs there). The copies must agree: a record the
fast path sends without the full parse must be one `plain_tail` accepts, read the same
way (and `plain_tail` is property-tested against `unwrap`). Seeded mutations of a valid
envelope go through a level worker on fakes, once per implementation; which records
skipped `send_one` is compared with what `plain_tail` says of their headers."""

from __future__ import annotations

import random
from typing import Any

import pytest

from delayservice.envelope import plain_tail
from tests.level.fakes import LEVEL, PREVIOUS_DELAY_MS, TARGET, FakeClock, make_level_rig
from tests.level.test_consumer_loop import append, cycle, subscribed

RECORDS = 600

FIELDS: dict[str, list[Any]] = {
    "delay-v": [b"2", b"01", b"", None, "1"],
    "delay-target": [b"", None, b"\xff", TARGET],
    "delay-ms": [
        str(PREVIOUS_DELAY_MS).encode(),
        str(LEVEL.delay_ms + 1).encode(),
        b"",
        b"-1",
        b" 5000",
        b"05000",
        "5000",
        None,
        b"9" * 40,
        "٣".encode(),
    ],
    "delay-id": [b"", None, "é".encode(), "id"],
}
"""Wrong values for each envelope field (the fast path must refuse each)."""
PARTITIONERS: list[Any] = [b"consistent_random", b"fnv1a", b"murmur2", b"crc", b"", None, "fnv1a"]
"""`delay-partitioner` values, valid and not."""
USER: list[tuple[Any, Any]] = [
    ("trace", b"abc"),
    ("u", None),
    ("", b""),
    ("delay-x", b"1"),
    ("delay-due-ms", b"1"),
    ("Delay-v", b"1"),
    ("ünï", b"\x00\xff"),
]


def _headers(rng: random.Random, offset: int) -> list[tuple[Any, Any]]:
    """A valid envelope half the time; else one field wrong, or the tail out of shape."""
    user = rng.sample(USER, rng.randint(0, 2))
    delay = rng.choice([LEVEL.delay_ms, 3_000, PREVIOUS_DELAY_MS + 1])
    tail: list[tuple[Any, Any]] = [
        ("delay-v", b"1"),
        ("delay-target", TARGET.encode()),
        ("delay-ms", str(delay).encode()),
        ("delay-id", f"id-{offset}".encode()),
    ]
    if rng.random() < 0.4:  # the SDK writes its partitioner after the id
        tail.append(("delay-partitioner", rng.choice(PARTITIONERS)))
    twist = rng.random()
    if twist < 0.5:
        pass
    elif twist < 0.8:
        field = rng.randrange(4)
        tail[field] = (tail[field][0], rng.choice(FIELDS[tail[field][0]]))
    elif twist < 0.85:
        i, j = rng.sample(range(4), 2)
        tail[i], tail[j] = tail[j], tail[i]
    elif twist < 0.9:
        tail.append(("delay-due-ms", rng.choice([b"0", b"123", b"x", None])))
    elif twist < 0.95:
        tail.insert(rng.randint(0, 3), ("delay-v", b"1"))
    else:
        del tail[rng.randrange(4)]
    return [*user, *tail]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_what_the_fast_path_sends_plain_tail_reads_the_same_way(clock: FakeClock, seed: int):
    rng = random.Random(seed)
    rig = subscribed(make_level_rig(clock=clock))
    rig.consumer.queue_rebalance("assign", 0)
    sent_headers: dict[int, list[tuple[Any, Any]]] = {}
    for offset in range(RECORDS):
        headers = _headers(rng, offset)
        (appended,) = append(rig, 0, headers=headers)
        sent_headers[appended] = headers
    route = rig.forwarder.sender.route
    slow: set[int] = set()
    full_parse = route.send_one

    def counted(partition: int, record: Any, now_ms: int) -> None:
        slow.add(record.offset())
        full_parse(partition, record, now_ms)

    route.send_one = counted  # type: ignore[method-assign]
    cycle(rig, 3)

    fast = sorted(set(sent_headers) - slow)
    assert len(fast) > RECORDS // 10, "too few records took the fast path to compare"
    assert len(slow) > RECORDS // 10, "too few records took the full parse to compare"
    by_id = {s.delay_id: s for s in rig.producer.sent if s.topic == TARGET}
    for offset in fast:
        headers = sent_headers[offset]
        tail = plain_tail(headers)
        assert tail is not None, f"the fast path sent what plain_tail refuses: {headers!r}"
        target, delay_ms, message_id, due_ms, user, partitioner = tail
        fields = dict(headers[len(user) :])
        assert (target, delay_ms, due_ms) == (TARGET, int(fields["delay-ms"]), None), headers
        assert partitioner == ((fields.get("delay-partitioner") or b"").decode() or None)
        assert PREVIOUS_DELAY_MS < delay_ms <= LEVEL.delay_ms
        sent = by_id[message_id]
        assert sent.headers[: len(user)] == user, headers
