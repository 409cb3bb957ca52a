"""How far off a pending message is due, in the classes operators ask about.

The daemon's gauges and `delayservice pending` share these, so the dashboard and the
command line never disagree on what "within an hour" means.
"""

from __future__ import annotations

from typing import Final

OVERDUE: Final = "overdue"
LATER: Final = "later"
WITHIN: Final = (("1m", 60_000), ("1h", 3_600_000), ("1d", 86_400_000), ("30d", 2_592_000_000))
"""(label, milliseconds): due within that long from now (and not overdue)."""
NAMES: Final = (OVERDUE, *(name for name, _ in WITHIN), LATER)


def bucket_of(due_ms: int, now_ms: int) -> str:
    """The class of a message due at `due_ms`: overdue once its due time has passed."""
    ahead = due_ms - now_ms
    if ahead < 0:
        return OVERDUE
    for name, span in WITHIN:
        if ahead <= span:
            return name
    return LATER


def empty() -> dict[str, int]:
    return dict.fromkeys(NAMES, 0)
