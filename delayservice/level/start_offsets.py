"""Where a level partition starts being read: when it is assigned (by a rebalance, or
to a consumer that replaced a fatal one), and when the forwarder dropped what it held
and everything owned is read again (`reseek`).

The start is fetched here and handed to the client explicitly, never left to its own
fetch: it must wait out the unstable offsets a killed member's open transaction holds,
and it may come from the other worker layout's group when that one got further.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition
from prometheus_client import Counter

from delayservice.forward.buffer import TP
from delayservice.forward.forwarder import Forwarder
from delayservice.kafka.client_errors import fatal_error_in, raised_by
from delayservice.kafka.client_seam import ConsumerClient
from delayservice.kafka.consumer_fatal import fatal_error
from delayservice.kafka.consumer_keeper import ConsumerKeeper
from delayservice.level.partition_group import PartitionGroup
from delayservice.level.partition_names import named, tp_of
from delayservice.level.reading_state import ReadingState

log = logging.getLogger(__name__)

COMMITTED_TIMEOUT_S: Final = 10.0
STABLE_RETRY_S = 0.5
STABLE_WAIT_NOTE_S: Final = 1.0
STABLE_WAIT_WARN_S: Final = 60.0
"""Waiting longer than this for stable offsets (an open transaction is aborted by the
broker within its timeout, 10 s, plus its abort check) is logged as a warning."""

RESEEK_ASK_LIMIT_S = 20.0
"""How long a re-seek asks one client for committed offsets before that client is
replaced. A re-seek runs on the consumer thread between reads, so the client's queue,
where librdkafka says what became of its group membership and its coordinator, goes
unserved while it asks. After a broker frozen for 35 s a client that had lost its
coordinator answered "Local: Timed out" to every ask for minutes while a fresh client
of the same group was answered at once (row 18 exactly-once, docs/faults.md). Two
asks that timed out; a killed member's transaction (10 s, plus the broker's abort
check) is usually over by then, and a client replaced while one is not waits again
as it is assigned."""

ASSIGN_ASK_LIMIT_S = 120.0
"""How long an assignment asks one client for committed offsets before that client is
replaced: well past what a killed member's open transaction holds them for (the
transaction timeout, 10 s, plus the broker's abort check, 10 s by default) and a
broker restart, so a client still not answered lost its coordinator as a re-seek's
did (`RESEEK_ASK_LIMIT_S`). Unbounded, the partitions it was given stayed unread for
as long as the client lived. Its successor's assignment asks again; from 60 s on
(`STABLE_WAIT_WARN_S`) every ask is a warning."""

Fallback = Callable[[list[TP]], dict[TP, int] | None]
"""Committed offsets another consumer group holds for these partitions (the other worker
layout's, `layout.OtherLayout`); None while they are not stable yet (a killed member's
transaction still holds them)."""


class StartOffsets:
    """One per consumer loop, used on its thread (and in its rebalance callbacks) only."""

    def __init__(
        self,
        name: str,
        keeper: ConsumerKeeper,
        stopping: threading.Event,
        loop_errors: Counter,
        reading: ReadingState,
        group: PartitionGroup,
        forwarder: Forwarder,
    ) -> None:
        """`stopping`: set when the loop stops; no wait for stable offsets outlasts it.
        `reading`, `group`, `forwarder`: what a re-seek empties, seeks and tells."""
        self._name = name
        self._keeper = keeper
        self._stopping = stopping
        self._m_loop_errors = loop_errors
        self._reading = reading
        self._group = group
        self._forwarder = forwarder

    def reseek(self, fallback: Fallback | None) -> bool:
        """The forwarder dropped what it held (an unknown transaction outcome, a group
        error): every owned partition's queue is emptied and the partition is read again
        from where an assignment would start it (`find`: its committed offset, which
        says what that transaction did, or the other worker layout's when that is
        later; a partition idle since a change of layout has no commit in this group).
        Done on the one thread that admits records, so nothing read before the seek is
        queued after it. False: not done (stopping, or the client is to be replaced:
        gone fatal, or not answering), the request left in place and nothing read until
        it is."""
        owned = sorted(self._reading.owned)
        if owned:
            consumer = self._keeper.client
            start = self.find(
                consumer,
                [TopicPartition(*tp) for tp in owned],
                fallback,
                give_up_after_s=RESEEK_ASK_LIMIT_S,
                asking="a re-seek",
            )
            if start is None:
                return False
            self._group.drop(set(owned))
            for tp in start:
                self._group.assign(tp_of(tp))
                self._reading.rewind.pop(tp_of(tp), None)
                consumer.seek(tp)
                self._reading.next[tp_of(tp)] = tp.offset
            log.info(
                "%s: reading %s again from their start offsets",
                self._name,
                ", ".join(f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in start),
            )
        self._forwarder.inbox.reseek_done()
        return True

    def find(
        self,
        consumer: ConsumerClient,
        partitions: list[TopicPartition],
        fallback: Fallback | None,
        give_up_after_s: float,
        asking: str,
    ) -> list[TopicPartition] | None:
        """Where each partition starts, whenever it starts: newly assigned or read again.

        A member killed mid-commit leaves its transaction open, and with it the offsets
        it sent: until the broker aborts it (the transaction timeout), the committed
        offsets of those partitions are unstable, and a read_committed client waits.
        librdkafka's own fetch on assignment could, when a rebalance came in during
        that wait, start such a partition from `auto.offset.reset`, the beginning:
        seen under group churn as a whole partition forwarded again (67 duplicates
        for a read_committed reader). `committed()` waits for the same answer and
        either gives it or times out, so this asks until it answers. A partition the
        other worker layout's group got further in starts there (`fallback`), waiting
        the same way. None: stopping, or the client went fatal or has been asked for
        longer than `give_up_after_s` (it is replaced at the next turn, and its
        successor's assignment starts by this same rule). `asking`: what asks, for
        the line that says why the client was replaced."""
        if not partitions:
            return []
        asked = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        since = time.monotonic()
        while True:
            answer: list[tuple[list[TopicPartition] | None, str]] = []
            raised = raised_by(
                functools.partial(self._ask_start, consumer, asked, fallback, answer)
            )
            if answer and answer[0][0] is not None:
                start = answer[0][0]
                break
            reason = answer[0][1] if answer else "?"
            if isinstance(raised, KafkaException):  # a bare KafkaError comes as one too
                reason = str(raised.args[0].str() if raised.args else raised)
                fatal = fatal_error_in(raised)
                if fatal is not None:
                    self._keeper.fail(fatal.str())
                    return None
            elif raised is not None:  # never leave the callback without the assignment
                reason = repr(raised)
                self._m_loop_errors.inc()
                log.error("%s: fetching the start offsets failed", self._name, exc_info=raised)
            if self._went_fatal(consumer, asked[0]):
                return None
            if time.monotonic() - since >= give_up_after_s:
                self._keeper.fail(
                    f"committed offsets not given for {give_up_after_s:.0f} s on {asking} "
                    f"({reason}); a new client asks instead"
                )
                return None
            if self._stopping.is_set():
                return None
            log.log(
                logging.WARNING if time.monotonic() - since > STABLE_WAIT_WARN_S else logging.INFO,
                "%s: committed offsets of %s not given yet (%s): an open transaction of a "
                "member that stopped mid-commit holds them until the broker ends it; asking again",
                self._name,
                named(map(tp_of, asked)),
                reason,
            )
            self._stopping.wait(STABLE_RETRY_S)
        waited = time.monotonic() - since
        if waited > STABLE_WAIT_NOTE_S:
            log.info(
                "%s: committed offsets of %s took %.1f s (an open transaction held them)",
                self._name,
                named(map(tp_of, asked)),
                waited,
            )
        return start

    def _went_fatal(self, consumer: ConsumerClient, tp: TopicPartition) -> bool:
        """Whether the client went fatal since the last ask, which only its queue would
        say (`kafka.consumer_fatal`); if so it is replaced at the next turn, and the
        asking starts over with its successor."""
        error = fatal_error(consumer, tp.topic, tp.partition)
        if error is None:
            return False
        self._keeper.fail(f"went fatal while its committed offsets were asked ({error.str()})")
        return True

    def _ask_start(
        self,
        consumer: ConsumerClient,
        asked: list[TopicPartition],
        fallback: Fallback | None,
        into: list[tuple[list[TopicPartition] | None, str]],
    ) -> None:
        into.append(self._try_start(consumer, asked, fallback))

    def _try_start(
        self, consumer: ConsumerClient, asked: list[TopicPartition], fallback: Fallback | None
    ) -> tuple[list[TopicPartition] | None, str]:
        """One ask of `find`: the start, or None and why not yet."""
        committed = consumer.committed(asked, timeout=COMMITTED_TIMEOUT_S)
        failed = [tp for tp in committed if tp.error is not None]
        if failed:
            return None, failed[0].error.str() if failed[0].error is not None else "?"
        start = self._with_fallback(committed, fallback)
        if start is None:
            return None, "the other worker layout's group holds unstable offsets"
        return start, ""

    def _with_fallback(
        self, committed: list[TopicPartition], fallback: Fallback | None
    ) -> list[TopicPartition] | None:
        """Where each partition starts: the later of this group's committed offset and the
        fallback's (offsets only move forward, so the later one is the group that ran
        last); None while the fallback's are not stable."""
        other: dict[TP, int] = {}
        if fallback is not None:
            found = fallback([tp_of(tp) for tp in committed])
            if found is None:
                return None
            other = found
        out = []
        for tp in committed:
            offset = max(tp.offset, other.get(tp_of(tp), tp.offset))
            if offset != tp.offset:
                log.info(
                    "%s: %s[%d] starts at %d, where the other worker layout got to (%d here)",
                    self._name,
                    tp.topic,
                    tp.partition,
                    offset,
                    tp.offset,
                )
            start = offset if offset >= 0 else OFFSET_BEGINNING
            out.append(TopicPartition(tp.topic, tp.partition, start))
        return out
