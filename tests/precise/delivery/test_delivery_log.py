"""What a transaction's delivery record names of the intake's dead letters: records no
slot file holds, whose offsets the intake commits only after the transaction."""

from __future__ import annotations

from typing import Any

from delayservice.precise.delivery.delivery_log import DeliveryLog
from delayservice.precise.delivery.sent_records import DEAD_LETTERS, decode_sent
from delayservice.precise.intake.offset_ledger import PartitionLedger
from delayservice.precise.storage.slot_record import SlotRecord

DONE = "timers.done"


class _Produced:
    """The produce calls a transaction makes (the fake's refusals do not matter here)."""

    def __init__(self) -> None:
        self.values: list[bytes] = []

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: Any = None) -> None:
        if topic == DONE:
            self.values.append(value)


def _dead_letter(partition: int, offset: int) -> SlotRecord:
    return SlotRecord(partition, offset, b"k", b"v", [], None, 0, PartitionLedger(partition))


def _named(log: DeliveryLog, runs: Any = ()) -> dict[tuple[int, int], set[int]] | None:
    """What the next transaction's delivery record names (None: it writes none); it
    commits, and its settled marks are written."""
    produced = _Produced()
    log.write(produced, list(runs))
    log.committed()
    log.marked(log.commits)
    return decode_sent(produced.values[-1]) if produced.values else None


def test_a_dead_letter_is_named_until_the_intake_commits_past_it() -> None:
    committed: dict[int, int] = {}
    log = DeliveryLog(
        DONE,
        "timers.outcomes",
        0,
        lambda _overrides: None,  # type: ignore[arg-type,return-value]
        committed_past=lambda partition, offset: committed.get(partition, -1) > offset,
    )
    runs = [(("timers", 0), [_dead_letter(0, 5)]), (("timers", 1), [_dead_letter(1, 9)])]
    assert _named(log, runs) == {(0, DEAD_LETTERS): {5}, (1, DEAD_LETTERS): {9}}
    assert _named(log) == {(0, DEAD_LETTERS): {5}, (1, DEAD_LETTERS): {9}}  # carried
    committed[0] = 6
    assert _named(log) == {(1, DEAD_LETTERS): {9}}
    committed[1] = 9  # the offset itself is not past it
    assert _named(log) == {(1, DEAD_LETTERS): {9}}
    committed[1] = 10
    assert _named(log) is None


def test_a_dead_letter_in_an_aborted_transaction_is_not_carried() -> None:
    log = DeliveryLog(DONE, "timers.outcomes", 0, lambda _overrides: None)  # type: ignore[arg-type,return-value]
    log.write(_Produced(), [(("timers", 0), [_dead_letter(0, 5)])])  # never committed
    assert _named(log) is None
