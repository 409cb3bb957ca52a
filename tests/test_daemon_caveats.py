"""What the daemon tells an operator at start when its settings promise less than they
read as."""

from __future__ import annotations

import pytest

from delayservice.daemon import precise_guarantee_caveat
from delayservice.settings import Settings


@pytest.mark.parametrize(
    ("precise", "guarantee", "warned"),
    [
        (True, "exactly-once", True),
        (True, "at-least-once", False),
        (False, "exactly-once", False),
    ],
)
def test_exactly_once_with_precise_mode_says_exact_messages_go_at_least_once(
    precise: bool, guarantee: str, warned: bool
) -> None:
    settings = Settings(bootstrap_servers="127.0.0.1:9", precise=precise, guarantee=guarantee)
    caveat = precise_guarantee_caveat(settings)
    assert (caveat is not None) is warned
    assert not warned or "at least once" in (caveat or "")
