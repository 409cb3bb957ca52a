"""Hostile records for the fuzz scenario, all drawn from one seeded `random.Random`.

Each starts as a valid envelope and gets zero to two mutations of its envelope headers
plus random user headers, keys and values. What the record deserves is not decided
here: `measure.expect` judges each record by what the broker stored, so the generator
may be as wild as it likes without the verdict trusting it.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass

HeaderValue = bytes | str | None
Headers = list[tuple[str, HeaderValue]]

MAX_VALUE = 900 * 1024
RECORD_LIMIT = 1_000_000
"""librdkafka's default message.max.bytes, for the test's producer and the daemon's."""


@dataclass(frozen=True)
class FuzzTopics:
    levels: list[tuple[str, int]]  # (topic, delay ms), smallest first
    partitions: int  # of each level topic
    targets: list[str]  # existing plain targets
    target_partitions: int
    dead_letter_topic: str
    missing_topic: str


def _unicode(rng: random.Random, length: int) -> str:
    """Printable code points from every plane, never a surrogate (those cannot be sent)."""
    ranges = ((0x20, 0x7E), (0xA0, 0xD7FF), (0xE000, 0xFFFD), (0x10000, 0x10FFFF))
    out = []
    for _ in range(length):
        low, high = rng.choice(ranges)
        out.append(chr(rng.randint(low, high)))
    return "".join(out)


def _header_name(rng: random.Random) -> str:
    """User header names, including look-alikes of the envelope's (never `delay-*`,
    which the format reserves, nor `dlq-*`, which the verdict reads)."""
    return rng.choice(
        [
            "",
            "x",
            "trace-id",
            "DELAY-TARGET",
            "Delay-V",
            "delay_ms",
            "delay",
            "dlq",
            "sp ace",
            "tab\there",
            "ü✓-名前",
            "a" * 1000,
            _unicode(rng, rng.randint(1, 30)),
        ]
    )


def _header_value(rng: random.Random) -> HeaderValue:
    roll = rng.random()
    if roll < 0.15:
        return None
    if roll < 0.25:
        return b""
    if roll < 0.45:
        return rng.randbytes(rng.randint(1, 60))  # mostly not UTF-8
    if roll < 0.65:
        return _unicode(rng, rng.randint(1, 40))
    if roll < 0.67:
        return rng.randbytes(rng.randint(10_000, 90_000))
    return f"value-{rng.randrange(10**6)}".encode()


def _value(rng: random.Random) -> bytes | None:
    roll = rng.random()
    if roll < 0.05:
        return None
    if roll < 0.1:
        return b""
    if roll < 0.13:
        return rng.randbytes(rng.randint(100 * 1024, MAX_VALUE))
    return rng.randbytes(rng.randint(1, 2000))


def _key(rng: random.Random) -> bytes | None:
    roll = rng.random()
    if roll < 0.2:
        return None
    if roll < 0.3:
        return b""
    if roll < 0.6:
        return rng.randbytes(rng.randint(1, 50))
    return f"key-{rng.randrange(100)}".encode()


class HostileFactory:
    """Builds hostile records; `seq` makes every usable delay-id unique across a run."""

    def __init__(self, rng: random.Random, topics: FuzzTopics) -> None:
        self.rng = rng
        self.topics = topics
        self.seq = 0

    def _mutations(self, level_ms: int) -> dict[str, list[Callable[[], HeaderValue]]]:
        """Replacement values per envelope header; DROP removes the header."""
        rng, t = self.rng, self.topics
        some_level = lambda: rng.choice(t.levels)[0]  # noqa: E731
        return {
            "delay-v": [
                *(lambda v=v: v for v in (None, b"2", b"01", b" 1", b"1 ", b"", b"\xff")),
                lambda: "\uff11",  # full-width digit one
                lambda: b"1\x00",
                lambda: b"0",
            ],
            "delay-ms": [
                *(
                    lambda v=v: v
                    for v in (None, b"-5", b"abc", b"1_000", b"", b" 12", b"+12", b"12.5")
                ),
                lambda: "\uff11\uff12",  # full-width digits
                lambda: b"1e3",
                lambda: b"\xff\xfe",
                lambda: str(10**30),
                lambda: str(2**63),
                lambda: "9" * 40,
                # Longer than the level: must be held to its own delay, never early.
                lambda: str(level_ms + rng.randint(1, 3000)),
                lambda: str(level_ms + rng.randint(1, 3000)),
                lambda: str(level_ms + rng.randint(1, 3000)),
            ],
            "delay-partition": [
                *(lambda v=v: v for v in (None, b"-1", str(10**12), b"x", b"", b"\xff")),
                lambda: str(t.target_partitions),
                lambda: str(t.target_partitions + 5),
                lambda: str(rng.randrange(t.target_partitions)),
            ],
            "delay-target": [
                *(lambda v=v: v for v in (None, b"", b"a\x00b", "has space", b"\xff\xfe")),
                lambda: "t" * 300,
                lambda: "é" * 300,  # 600 bytes
                lambda: "__consumer_offsets",
                lambda: ".",
                lambda: "..",
                lambda: t.missing_topic,
                lambda: "a" * 249,
                lambda: t.dead_letter_topic,
                some_level,
                lambda: rng.choice(t.targets) + "\n",
            ],
            "delay-id": [
                *(lambda v=v: v for v in (None, b"", b"\xff\xfe")),
                lambda: f"long-{uuid.uuid4().hex}-" + "x" * 20_000,
                lambda: f"ü✓-{uuid.uuid4().hex}",
            ],
            "delay-due-ms": [lambda: None, lambda: b"abc", lambda: b"-1"],
            "delay-partitioner": [
                *(
                    lambda v=v: v
                    for v in (None, b"", b"Murmur2", b"murmur2 ", b"crc32", b"\xff", b"random\x00")
                ),
                lambda: "consistent" * 1000,
                # Valid ones: the record goes where that partitioner puts its key.
                *(lambda v=v: v for v in (b"consistent", b"fnv1a_random", b"murmur2", b"random")),
            ],
        }

    def record(self, level_index: int) -> tuple[int, bytes | None, bytes | None, Headers]:
        """(level-topic partition, key, value, headers) of one hostile record."""
        rng, t = self.rng, self.topics
        self.seq += 1
        level_ms = t.levels[level_index][1]
        envelope: dict[str, HeaderValue] = {
            "delay-v": b"1",
            "delay-target": rng.choice(t.targets),
            "delay-ms": str(rng.randint(0, level_ms)),
            "delay-id": f"h{self.seq}-{uuid.uuid4().hex}",
        }
        if rng.random() < 0.3:
            envelope["delay-partition"] = str(rng.randrange(t.target_partitions))
        if rng.random() < 0.5:
            envelope["delay-partitioner"] = rng.choice(
                [b"consistent_random", b"consistent", b"fnv1a", b"fnv1a_random", b"murmur2_random"]
            )
        mutations = self._mutations(level_ms)
        duplicate = None
        for _ in range(rng.choices((0, 1, 2), (0.15, 0.6, 0.25))[0]):
            if rng.random() < 0.1:
                duplicate = rng.choice(list(envelope))
                continue
            name = rng.choice(list(mutations))
            if rng.random() < 0.15 and name in envelope:
                del envelope[name]  # the header is missing altogether
            else:
                envelope[name] = rng.choice(mutations[name])()
        headers: Headers = [(n, v) for n, v in envelope.items()]
        if duplicate is not None and duplicate in envelope:
            copy = envelope[duplicate] if rng.random() < 0.5 else rng.choice([b"1", b"x", None])
            headers.append((duplicate, copy))
        user = [(_header_name(rng), _header_value(rng)) for _ in range(rng.randint(0, 4))]
        if rng.random() < 0.5:
            headers = user + headers
        else:
            headers = headers + user
            if rng.random() < 0.3:
                rng.shuffle(headers)
        key, value = _key(rng), _value(rng)
        if rng.random() < 0.01:
            # Just under the limit: the forwarded copy may still fit, a dead-letter copy
            # with its extra headers may not (the payload-free stub path).
            used = len(key or b"") + sum(len(n.encode()) + _len(v) for n, v in headers)
            value = rng.randbytes(max(0, RECORD_LIMIT - rng.randint(100, 2000) - used))
        return rng.randrange(t.partitions), key, value, headers


REFUSED = "refused"
UNMATCHED = "unmatched"


def hostile_marker(
    rng: random.Random, levels: int, partitions: int, good_ids: list[str]
) -> tuple[Headers, str | None]:
    """A marker for the level markers topic that no daemon can act on, and the answer
    it must get (None: no rule says which, such as a well-formed id that names nothing,
    or a record that is no marker at all and gets none); now and then a valid one for a
    good record, which must act."""
    from delayservice.markers.level_ids import level_id

    now = 1_764_000_000_000
    named = level_id(1, rng.randrange(partitions), now)
    kind = rng.choice(["delay-cancel", "delay-reschedule"])
    roll = rng.random()
    if roll < 0.08 and good_ids:
        headers: Headers = [("delay-v", b"1"), (kind, rng.choice(good_ids).encode())]
        if kind == "delay-reschedule":
            headers.append(("delay-ms", str(rng.randint(0, 2_000)).encode()))
        return headers, None
    cases: list[tuple[HeaderValue, str | None, Headers]] = [
        (b"\xff\xfe\xfd", REFUSED, []),
        (b"", REFUSED, []),
        (None, REFUSED, []),
        (uuid.uuid4().hex, UNMATCHED, [("delay-ms", b"100")]),  # the old form of level ids
        (f"{uuid.uuid4().hex}-l{levels + rng.randint(1, 50)}p0", REFUSED, [("delay-ms", b"9")]),
        (
            f"{uuid.uuid4().hex}-l1p{partitions + rng.randint(0, 10**6)}",
            REFUSED,
            [("delay-ms", b"9")],
        ),
        (named, None, [("delay-ms", b"1")]),  # well formed, no such message
        (named + "-" + "x" * rng.randint(1, 20_000), UNMATCHED, [("delay-ms", b"1")]),
        (_unicode(rng, rng.randint(1, 40)), UNMATCHED, [("delay-ms", b"1")]),
    ]
    if kind == "delay-reschedule":
        cases += [
            (named, REFUSED, []),  # no new time
            (named, REFUSED, [("delay-ms", b"-5")]),
            (named, REFUSED, [("delay-ms", b"1e3")]),
            (named, REFUSED, [("delay-due-ms", b"\xff")]),
            (named, REFUSED, [("delay-ms", str(10**14).encode())]),  # beyond the top level
        ]
    raw, answer, extra = rng.choice(cases)
    headers = [("delay-v", b"1"), (kind, raw), *extra]
    if rng.random() < 0.3:
        headers.append((_header_name(rng), _header_value(rng)))
    if rng.random() < 0.05:
        return [("x-not-a-marker", b"1")], None  # no marker header at all: no answer
    return headers, answer


def _len(value: HeaderValue) -> int:
    if value is None:
        return 0
    return len(value.encode() if isinstance(value, str) else value)
