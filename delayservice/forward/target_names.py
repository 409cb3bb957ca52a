"""Kafka's naming rule for target topics, checked once per distinct name."""

from __future__ import annotations

from typing import Final

from delayservice.envelope import preview
from delayservice.forward import dead_letter as dl
from delayservice.topic_names import MAX_LENGTH as MAX_TOPIC_NAME
from delayservice.topic_names import invalid_reason

MEMO_SIZE: Final = 10_000


class TargetNames:
    """Memo of `invalid_reason` per target name; names come from records, so it is
    bounded, and a name too long to be a topic is refused without being remembered."""

    def __init__(self, reserved: frozenset[str]) -> None:
        self._reserved = reserved
        self._memo: dict[str, str | None] = {}

    def problem(self, target: str) -> tuple[str, str] | None:
        """(dead-letter reason, detail) when `target` cannot be a topic, else None."""
        cached = self._memo.get(target, "")
        if cached == "":
            cached = invalid_reason(target, self._reserved)
            if len(target) <= MAX_TOPIC_NAME:
                if len(self._memo) >= MEMO_SIZE:
                    self._memo.clear()
                self._memo[target] = cached
        if cached is None:
            return None
        return dl.REASON_INVALID_TARGET, f"target {preview(target)}: {cached}"

    def __len__(self) -> int:
        return len(self._memo)
