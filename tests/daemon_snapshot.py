"""What a daemon in a test was doing when the test gave up waiting on it.

A record that never arrives in a CI run leaves only "got 0 of 1": this names the
figures that say which stage held it (read, held, forwarded, dead-lettered, gated)
and the line each of the daemon's threads stood on."""

from __future__ import annotations

import sys
import threading
import traceback
from pathlib import Path
from typing import Any

_FIGURES = (
    "delayservice_consumed_total",
    "delayservice_forwarded_total",
    "delayservice_dead_lettered_total",
    "delayservice_forward_errors_total",
    "delayservice_loop_errors_total",
    "delayservice_buffered_messages",
    "delayservice_precise_pending_messages",
    "delayservice_precise_read_through_lag_seconds",
    "delayservice_level_markers_lag_seconds",
    "delayservice_level_markers_answers_lag_seconds",
    "delayservice_oldest_overdue_seconds",
    "delayservice_ready",
)
_FRAMES = 3
"""Innermost frames shown per thread: enough for the call it waits in and its caller."""


def figures(daemon: Any) -> list[str]:
    """The nonzero samples of the stage figures, one line each."""
    lines = []
    for metric in daemon.registry.collect():
        for sample in metric.samples:
            if sample.name in _FIGURES and sample.value:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                lines.append(f"{sample.name}{{{labels}}} {sample.value:g}")
    return lines


def thread_lines() -> list[str]:
    """Where each thread of this process stands, innermost frame first."""
    frames = sys._current_frames()  # the one way to see other threads' stacks
    lines = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        if frame is None or thread is threading.current_thread():
            continue
        stack = traceback.extract_stack(frame)[-_FRAMES:]
        where = " <- ".join(f"{s.name}@{Path(s.filename).name}:{s.lineno}" for s in reversed(stack))
        lines.append(f"{thread.name}: {where}")
    return lines


def where_read(consumer: Any, partitions: list[Any]) -> str:
    """Per partition: where the topic starts and ends (high watermark) and where this
    read_committed consumer stands, so a record that is on the topic but not readable
    (an open transaction ahead of it) shows apart from one that never came."""
    try:
        positions = {tp.partition: tp.offset for tp in consumer.position(partitions)}
        lines = [
            f"  [{tp.partition}] offsets {low}-{high}, read to {positions.get(tp.partition)}"
            for tp in partitions
            for low, high in [consumer.get_watermark_offsets(tp, timeout=5)]
        ]
    except Exception as exc:  # a diagnosis must not hide the failure it explains
        lines = [f"  (could not be asked: {exc!r})"]
    return "the topic, as the reader saw it:\n" + "\n".join(lines) + "\n"


def snapshot(daemons: list[Any]) -> str:
    """A block to append to a failure message ('' without daemons)."""
    if not daemons:
        return ""
    parts = []
    for index, daemon in enumerate(daemons):
        parts.append(f"daemon {index}:")
        parts.extend(f"  {line}" for line in figures(daemon) or ["(no figure above zero)"])
    parts.append("threads:")
    parts.extend(f"  {line}" for line in thread_lines())
    return "\n".join(parts)
