"""The `sent:` records of the done topics, one per transaction (`delivery_log`): their
key, their form (per slot, the offsets delivered as runs, compressed), and the checks
a reader makes before it takes one.

The done topic is writable by whoever can write the precise topic, so nothing read off
it is trusted: a record that does not decode, or names more than can exist, is refused
whole (`decode_sent_record`, `sent_refusal`) and counted (`Dropped`), never raised.
"""

from __future__ import annotations

import base64
import json
import logging
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, NamedTuple

from delayservice.log_throttle import Throttle

log = logging.getLogger(__name__)

VERSION: Final = 1


MAX_PARTITION: Final = 1 << 14
"""Records naming partition numbers at or above this are refused: a precise topic has
far fewer, and forged ones for partitions that do not exist must not grow memory."""
MAX_NAMED: Final = 4_000_000
"""A `sent` record naming more offsets than this is malformed: a forged one must not
make its readers' memory grow without end."""
MAX_INFLATED: Final = 16 * 1024 * 1024
"""Bytes a `sent` record's runs may inflate to. The broker's 1 MB limit holds the
compressed form only, and zlib inflates up to about 1,000 times: a forged record could
otherwise ask for a gigabyte. `MAX_NAMED` offsets, every other one, take 16,000,009."""
INFLATE_STEP: Final = 1 << 20
_RUNS_ALPHABET: Final = b'0123456789-,:[]{}"'
"""Every byte `encode_sent`'s runs are made of: a step with any other (the padding of a
zlib bomb) ends the inflating there."""


def sent_key(member: int, writer: int | None = None) -> bytes:
    """The key of the records of what transactions under member `member`'s
    transactional id delivered: written by `member` itself, or (`writer`) by its
    replica when it took over (compaction keeps the latest of each writer)."""
    if writer is None or writer == member:
        return f"sent:{member}".encode()
    return f"sent:{member}:by:{writer}".encode()


Slot = tuple[int, int]
"""(partition, second): a slot file, and the records of it a transaction delivered."""
DEAD_LETTERS: Final = 0
"""The second that names, per partition, the intake's dead letters a transaction
delivered: records no slot file holds, whose offsets the intake commits only after the
transaction. No slot file is at second 0, so a reader that does not know this finds
none and lets them go."""


def encode_sent(
    member: int, offsets: Mapping[Slot, Iterable[int]], writer: int | None = None
) -> bytes:
    """Per slot, the sorted offsets as runs: [first, length, gap, length, ...] with each
    first relative to the end of the run before (small numbers: a burst is a few runs),
    compressed."""
    partitions: dict[str, list[int]] = {}
    for (partition, second), found in offsets.items():
        runs: list[int] = []
        end = 0
        length = 0
        for offset in sorted(set(found)):
            if length and offset == end:
                length += 1
            else:
                if length:
                    runs[-1] = length
                runs += [offset - end, 0]
                length = 1
            end = offset + 1
        if length:
            runs[-1] = length
            partitions[f"{partition}:{second}"] = runs
    packed = zlib.compress(json.dumps(partitions, separators=(",", ":")).encode())
    record: dict[str, Any] = {"v": VERSION, "member": member}
    if writer is not None and writer != member:
        record["by"] = writer
    record["sent"] = base64.b64encode(packed).decode()
    return json.dumps(record).encode()


class SentRecord(NamedTuple):
    member: int
    """Whose transactional id the transaction ran under."""
    writer: int
    """Who wrote it: the member, or its replica taking over."""
    offsets: dict[Slot, set[int]]
    """Per slot of the writer's, the offsets it delivered."""


def decode_sent(raw: bytes | None) -> dict[Slot, set[int]] | None:
    """The offsets a `sent` record names, or None for anything malformed (never raises:
    the done topic is writable by whoever can write the precise topic)."""
    record = decode_sent_record(raw)
    return None if record is None else record.offsets


def decode_sent_record(raw: bytes | None) -> SentRecord | None:
    """`decode_sent`, with whose id it ran under and who wrote it."""
    try:
        data: Any = json.loads(raw or b"")
        if not isinstance(data, dict) or data.get("v") != VERSION:
            return None
        member = int(data["member"])
        writer = int(data.get("by", member))
        partitions = json.loads(_inflate(base64.b64decode(data["sent"])))
        out: dict[Slot, set[int]] = {}
        named = 0
        for name, runs in partitions.items():
            partition, second = name.split(":")
            offsets = out.setdefault((int(partition), int(second)), set())
            end = 0
            for gap, length in zip(runs[::2], runs[1::2], strict=True):
                first = end + int(gap)
                named += int(length)
                if named > MAX_NAMED or int(length) < 1 or first < 0:
                    return None
                offsets.update(range(first, first + int(length)))
                end = first + int(length)
    except Exception:
        return None
    return SentRecord(member, writer, out)


def sent_refusal(key: bytes | None, record: SentRecord | None, members: int | None) -> str | None:
    """Why a `sent` record read from a done topic is not taken, or None to take it.

    Only daemons may write the done topics (docs/security.md), and they are read
    read_committed, so an aborted transaction's records never come here. What can
    still be checked is the shape: a body that decodes (`malformed`), is the one its
    key says (`key_mismatch`: compaction keeps the latest record per key, so a body
    under another member's key would stand in for that member's), names members that
    exist (`unknown_member`; `members` None: not checked), and names slots that can
    exist (`bad_slot`)."""
    if record is None:
        return "malformed"
    if key != sent_key(record.member, record.writer):
        return "key_mismatch"
    if members is not None and not (0 <= record.member < members and 0 <= record.writer < members):
        return "unknown_member"
    if any(not (0 <= p < MAX_PARTITION and second >= 0) for p, second in record.offsets):
        return "bad_slot"
    return None


class Dropped:
    """Counts (`count`, given the reason) and logs, at most once per reason every ten
    seconds, the records a reader of a done topic does not take."""

    def __init__(self, topic: str, count: Callable[[str], None] | None = None) -> None:
        self._topic = topic
        self._count = count
        self._throttle = Throttle()

    def __call__(self, reason: str) -> None:
        if self._count is not None:
            self._count(reason)
        held = self._throttle.allow(reason)
        if held is not None:
            log.warning(
                "%s: dropped a record (%s)%s; only daemons may write this topic (docs/security.md)",
                self._topic,
                reason,
                f", and {held} more since the last line" if held else "",
            )


def _inflate(packed: bytes) -> bytes:
    """`zlib.decompress`, a step at a time, refusing what inflates past `MAX_INFLATED`
    or to anything but runs: a bomb costs a step of work, not its whole size."""
    inflater = zlib.decompressobj()
    out = bytearray()
    data = packed
    while not inflater.eof:
        step = inflater.decompress(data, INFLATE_STEP)
        if step.translate(None, _RUNS_ALPHABET):
            raise ValueError("inflates to something other than runs")
        out += step
        if len(out) > MAX_INFLATED:
            raise ValueError(f"inflates past {MAX_INFLATED} bytes")
        data = inflater.unconsumed_tail
        if not data and not step and not inflater.eof:
            raise ValueError("cut short")
    return bytes(out)
