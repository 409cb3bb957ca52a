"""The two loops a level runs once per forwarded record: admitting, and sending.

Everything else a level does runs per batch, per partition or per commit; these two run
per record, on the forwarder's thread, where the daemon competes with a bare
consume->produce pipe for every instruction. So they live here, in plain Python that
`setup.py` also compiles with Cython when it can (`forward.speedups` picks the compiled
module when it was built from this very source, and this one otherwise): the same code,
interpreted or compiled, with no second copy to keep in step.

`hold_run` reads each record's envelope once, when it is admitted, and keeps a plain
record as a `Held` tuple (`forward.held_record`). Its checks are `envelope.plain_tail`'s,
made inline (a call per record costs here); `tests/forward/test_fast_path_agreement.py`
holds the two to agreeing. `send_held_run` sends the `Held` records of a due run as they
are and hands everything else to the sender's full parse.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

from delayservice.envelope import (
    _TARGET_NAMES,
    H_DELAY_MS,
    H_DUE_MS,
    H_ID,
    H_PARTITIONER,
    H_TARGET,
    H_VERSION,
    MAX_DIGITS,
    PARTITIONER_NAMES,
    PREFIX,
    _target_name,
)
from delayservice.forward.held_record import HeldView
from delayservice.kafka.record_headers import headers_of_run

PREFIX_LENGTH = len(PREFIX)
NO_HEADERS: tuple[Any, ...] = ()
ANY_PARTITION = -1
"""librdkafka's RD_KAFKA_PARTITION_UA: the partitioner decides (by key)."""


def hold_run(  # noqa: PLR0912, PLR0915  # one loop, inline on purpose
    records: list[Any], delay_ms: int, previous_ms: int, read_ms: int
) -> tuple[list[Any], int, list[tuple[int, int]]]:
    """`records` (one partition's, in offset order, read at `read_ms`) as queue entries:
    a `Held` for each plain record this level holds (`previous_ms` < delay-ms <=
    `delay_ms`), due its append time plus `delay_ms`; every other record as it is.
    Also the latest due time among them, and (offset, due) of each record the broker
    did not stamp (due a level after it was read)."""
    out: list[Any] = []
    append = out.append
    unstamped: list[tuple[int, int]] = []
    heads = headers_of_run(records)  # never record.headers(): see record_headers
    names = _TARGET_NAMES
    partitioners = PARTITIONER_NAMES
    last_ms: bytes = b""
    last_user: tuple[Any, ...] = NO_HEADERS  # the previous record's: names shared
    last_stamp, due, latest = -1, 0, 0
    for index, record in enumerate(records):
        headers = heads[index]
        kind, stamp = record.timestamp()
        if kind == TIMESTAMP_LOG_APPEND_TIME:
            if stamp != last_stamp:  # records of one batch share one due time
                last_stamp, due = stamp, stamp + delay_ms
                latest = max(latest, due)
            end = len(headers) if type(headers) is list else 0
            partitioner = None
            if end >= 5 and headers[-1][0] == H_PARTITIONER:
                partitioner = partitioners.get(headers[-1][1])
                end = end - 1 if partitioner is not None else 0
            if end >= 4:
                v, version = headers[end - 4]
                t, raw_target = headers[end - 3]
                m, raw_ms = headers[end - 2]
                i, raw_id = headers[end - 1]
                if (
                    v == H_VERSION
                    and t == H_TARGET
                    and m == H_DELAY_MS
                    and i == H_ID
                    and version == b"1"
                    and type(raw_ms) is bytes
                    and type(raw_id) is bytes
                    and type(raw_target) is bytes
                    and raw_target
                    and raw_id
                    and raw_id.isascii()
                    and raw_ms.isdigit()
                    and len(raw_ms) <= MAX_DIGITS
                    and previous_ms < int(raw_ms) <= delay_ms
                ):
                    target = names.get(raw_target)
                    if target is None:
                        try:
                            target = _target_name(raw_target)
                        except UnicodeDecodeError:
                            target = ""
                    user = NO_HEADERS
                    count = end - 4
                    if count:
                        kept = []
                        for position in range(count):
                            name, value = headers[position]
                            # The previous held record's names were checked already
                            # (a reserved one would not have been held): equal is clean.
                            if position < len(last_user) and name == last_user[position][0]:
                                name = last_user[position][0]  # one string for all records
                            elif name[:PREFIX_LENGTH] == PREFIX:
                                target = ""
                            kept.append((name, value))
                        user = tuple(kept)
                    if raw_ms == last_ms:
                        raw_ms = last_ms
                    else:
                        last_ms = raw_ms
                    if target:
                        last_user = user
                        append(
                            (record.offset(), due, target, record.value(), record.key(), user,
                             raw_id, raw_ms, partitioner)
                        )  # fmt: skip
                        continue
        else:
            late = read_ms + delay_ms
            unstamped.append((record.offset() or 0, late))
            latest = max(latest, late)
        append(record)
    return out, latest, unstamped


def send_held_run(  # noqa: PLR0912  # one loop, inline on purpose
    tp: tuple[str, int],
    records: list[Any],
    produce: Callable[..., None],
    now_ms: int,
    plain: bool,
    lateness: list[tuple[int, int]],
    sendable: Callable[[str], int],
    produce_waiting: Callable[..., None],
    send_one: Callable[[tuple[str, int], Any, int], None],
    later: type[Exception],
    place: Callable[[str | None, Any, int], int | None],
) -> int:
    """Send one partition's (`tp`'s) due run in order; how many went (the rest must wait: the
    sender's `later` error stopped it).

    A `Held` record (when nothing is `plain`-ly doomed or suspected) whose target
    `sendable` says exists (it gives the target's partition count, 0 for none) goes out
    as it is, by position, on the partition its producer's partitioner gives its key
    (`place`: `partitioners.place`), else where the producer puts it (`ANY_PARTITION`);
    a full local queue waits in `produce_waiting`. Anything else, and anything
    produce() raises beyond a full queue (at once, or while it waited for room: a
    transaction turned abortable, a target deleted meanwhile), goes to `send_one` (the
    full parse), which sends it, dead-letters it or says it must wait. Each
    forward's lateness (ms after its due time) is counted into `lateness` as (ms,
    records) pairs."""
    known: dict[str, int] = {}
    last_due, due_header, same = -1, (H_DUE_MS, b""), 0
    index = 0
    try:
        for index, record in enumerate(records):  # noqa: B007  # the handler reads it
            if type(record) is not tuple:
                send_one(tp, record, now_ms)
                continue
            if plain:
                _, due, target, value, key, user, raw_id, _, partitioner = record
                count = known.get(target)
                if count is None:
                    count = known[target] = sendable(target)
                if count:
                    partition = ANY_PARTITION
                    if partitioner is not None:
                        placed = place(partitioner, key, count)
                        if placed is not None:
                            partition = placed
                    if due != last_due:
                        if same:
                            lateness.append((now_ms - last_due, same))
                        last_due, due_header, same = due, (H_DUE_MS, str(due).encode()), 0
                    headers = [*user, (H_ID, raw_id), due_header]
                    try:
                        produce(target, value, key, partition, None, None, 0, headers)
                        same += 1
                        continue
                    except BufferError:
                        try:
                            produce_waiting(
                                produce, target, value, key, headers,
                                None if partition == ANY_PARTITION else partition,
                            )  # fmt: skip
                            same += 1
                            continue
                        except later:
                            raise
                        except Exception:  # noqa: S110  # refused while waiting: the full parse says
                            pass
                    except Exception:  # noqa: S110  # the full parse says what it was
                        pass
            send_one(tp, HeldView(tp, record), now_ms)
    except later:
        if same:
            lateness.append((now_ms - last_due, same))
        return index
    if same:
        lateness.append((now_ms - last_due, same))
    return len(records)
