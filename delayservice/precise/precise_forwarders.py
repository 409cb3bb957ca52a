"""The forwarders of one precise worker: the owner's, and with two copies exactly-once
the takeover's, which forwards this member's replica copies under the transactional id
of the member it replicates (`takeover`).

Both forward through the level workers' forwarder (`build_forwarder`) with precise
mode's routes and commit interval, and settle what their commit points made durable
(`settle`). Apart from `precise_worker`, which wires every part once in the order
records flow: the two forwarders are built alike, from the same things, and that
building is one job of its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from delayservice.forward.buffer import Runs
from delayservice.forward.build import build_forwarder
from delayservice.forward.forwarder import Forwarder, Routes, SharedId
from delayservice.levels import Level
from delayservice.metrics.service_metrics import ServiceMetrics
from delayservice.precise.delivery.delivery_log import DeliveryLog
from delayservice.precise.delivery.takeover import Takeover
from delayservice.precise.intake.offset_ledger import LevelLedger
from delayservice.precise.precise_route import PreciseRoute
from delayservice.precise.settle import settle_delivered, settle_durable
from delayservice.precise.wheel.slot_buffer import SlotBuffer
from delayservice.precise.wheel.wheel import Wheel
from delayservice.settings import Settings


def precise_routes(settings: Settings) -> Routes:
    """Where a precise record may go: its target, or the dead-letter topic; never back
    into a level (it is forwarded at its exact time, not re-published)."""
    return Routes(settings.dead_letter_topic, settings.internal_topics(), PreciseRoute)


def precise_commit_interval(settings: Settings) -> float:
    """A second between commit points at-least-once unless set; exactly-once, the
    levels' interval (0.1 s unless set): read_committed readers wait for it."""
    if settings.guarantee == "exactly-once":
        return settings.commit_interval()
    interval = settings.commit_interval_s
    return 1.0 if interval is None else interval


@dataclass(frozen=True, slots=True)
class PreciseForwarders:
    """What both forwarders of one precise level are built with: `wheel` holds their
    buffers, `offsets` the intake's offsets their dead letters settle."""

    level: Level
    settings: Settings
    metrics: ServiceMetrics
    make_producer: Callable[[dict[str, Any]], Any]
    on_fatal: Callable[[str], None]
    clock: Any
    wheel: Wheel
    offsets: LevelLedger

    def owner(
        self, delivery: DeliveryLog | None, *, transactional_id: str | None, replicated: bool
    ) -> Forwarder:
        """The owner's forwarder, from the wheel's buffer; exactly-once, under
        `transactional_id`, its transactions carrying `delivery`'s record; `replicated`:
        its replica may forward under the same id when it takes over."""
        settings = self.settings
        buffer = self.wheel.buffer
        settle: Callable[[Runs], None] = functools.partial(
            settle_durable, wheel=self.wheel, offsets=self.offsets
        )
        if delivery is not None:
            delivery.wake = buffer.wake
            settle = functools.partial(
                settle_delivered, wheel=self.wheel, offsets=self.offsets, delivery=delivery
            )
        return self._forwarder(
            self.level.name,
            buffer,
            transactional_id=transactional_id,
            settle=settle,
            ledger=delivery,
            shared_id=(
                SharedId(
                    f"member {(settings.precise_member + 1) % settings.precise_members} "
                    "(its replica)"
                )
                if replicated
                else None
            ),
        )

    def takeover(
        self, takeover: Takeover | None, owner: int, transactional_id: str
    ) -> Forwarder | None:
        """Two copies, exactly-once: the forwarder of this member's replica copies,
        under the transactional id of the member it replicates (`takeover`)."""
        buffer = self.wheel.takeover_buffer
        if takeover is None or buffer is None:
            return None
        copies_log = takeover.delivered
        copies_log.wake = buffer.wake
        forwarder = takeover.forwarder = self._forwarder(
            f"{self.level.name}-takeover",
            buffer,
            transactional_id=transactional_id,
            settle=functools.partial(
                settle_delivered, wheel=self.wheel, offsets=self.offsets, delivery=copies_log
            ),
            ledger=copies_log,
            shared_id=SharedId(
                f"member {owner} (the owner)",
                lazy=True,
                hold_back_s=self.settings.takeover_delay_s,
            ),
        )
        return forwarder

    def _forwarder(
        self,
        name: str,
        buffer: SlotBuffer,
        *,
        transactional_id: str | None,
        settle: Callable[[Runs], None],
        ledger: DeliveryLog | None,
        shared_id: SharedId | None,
    ) -> Forwarder:
        """A forwarder of this level from `buffer`: the owner's, or the takeover's."""
        return build_forwarder(
            [self.level],
            name,
            self.settings,
            self.metrics,
            buffer,
            precise_routes(self.settings),
            self.make_producer,
            self.on_fatal,
            commit_interval_s=precise_commit_interval(self.settings),
            transactional_id=transactional_id,
            settle=settle,
            ledger=ledger,
            shared_id=shared_id,
            clock=self.clock,
        )
