"""Precise mode's decisions on the shared forward path, which are few: a precise
record's delay is its own, checked when it was read, so nothing is re-published, out of
range or withdrawn by a marker here (precise markers act on the wheel, before a record
is due), and its envelope and due time come with it (`SlotRecord`).

Apart from the sender because forward/ serves level mode too and asks no mode
(`forward.send_route`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from delayservice import partitioners
from delayservice.envelope import forwarded_headers
from delayservice.forward.buffer import TP
from delayservice.forward.failures import Doom
from delayservice.forward.send_errors import ForwarderFatalError, SendLaterError
from delayservice.forward.sender import ANY_PARTITION, RecordSender
from delayservice.metrics.service_metrics import MISMATCH_KINDS, ServiceMetrics


class PreciseRoute:
    """A precise forwarder's route: owned by its sender, on the forwarder's thread."""

    def __init__(self, sender: RecordSender, metrics: ServiceMetrics) -> None:
        self._sender = sender
        for level in sender.levels.values():  # never counted here; the series exist
            for kind in MISMATCH_KINDS:
                metrics.level_mismatches.labels(level.name, kind)

    def send_run(self, tp: TP, records: list[Any]) -> int:
        """Precise records (`SlotRecord`), whose envelope and due time were read when
        they were admitted: the common one (no explicit target partition, a known
        target) is sent as it is; the rest take `send_one`."""
        sender = self._sender
        produce = sender.producer.produce
        lateness = sender.lateness_of(tp[0])
        plain = not sender.failures.doomed and not sender.failures.suspects
        known: dict[str, int] = {}  # target -> its partition count (0: it cannot be sent to)
        now_ms = sender.now_ms()
        for index, record in enumerate(records):
            envelope = record.envelope
            count = 0
            if plain and record.problem is None and envelope is not None:
                count = known.get(envelope.target, -1)
                if count < 0:
                    count = known[envelope.target] = sender.target_partitions(envelope.target)
                if envelope.partition is not None:
                    count = 0
            try:
                if not count or not self._fast_produce(produce, count, record):
                    self.send_one(tp, record, now_ms)
                    continue
            except SendLaterError:
                return index
            lateness.append((now_ms - record.due_ms, 1))
        return len(records)

    def _fast_produce(self, produce: Callable[..., None], count: int, record: Any) -> bool:
        """Produce a precise record's forward to its target (of `count` partitions), on
        the partition its producer's partitioner gives its key; False when produce()
        raised something a full queue does not explain, at once or while it waited for
        room (`send_one` then says what it was). Raises only what waiting raises to
        stop the run."""
        envelope = record.envelope
        target = envelope.target
        key = record.key()
        placed = partitioners.place(envelope.partitioner, key, count)
        headers = forwarded_headers(record.user, envelope, record.due_ms)
        try:
            partition = ANY_PARTITION if placed is None else placed
            produce(target, record.value(), key, partition, None, None, 0, headers)
        except BufferError:
            try:
                self._sender.produce_after_full(
                    produce, target, record.value(), key, headers, placed
                )
            except (SendLaterError, ForwarderFatalError):
                raise
            except Exception:
                return False
        except Exception:
            return False
        return True

    def send_one(self, tp: TP, record: Any, now_ms: int) -> None:
        """Everything but the common case: an earlier failure's doom or a problem found
        when the record was read, the target's checks (dead letters), then the forward.
        Raises only `SendLaterError` (and `ForwarderFatalError`)."""
        sender = self._sender
        try:
            doom = sender.doom_of(tp, record)
            if doom is None and record.problem is not None:
                doom = Doom(*record.problem)
            if doom is None:
                envelope = record.envelope
                count, problem = sender.target_check(envelope, None)
                if problem is None:
                    due = sender.group.due_of(tp, record)
                    sender.forward(tp, record, envelope, list(record.user), due, count, now_ms)
                    return
                doom = Doom(*problem)
            sender.dead_letter(tp, record, doom)
        except Exception as exc:
            sender.failed(tp, record, exc)

    def waiting(self) -> bool:
        return False

    def serve(self, begin: Callable[[], None]) -> None:
        return None
