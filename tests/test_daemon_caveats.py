"""What the daemon tells an operator at start when its settings promise less than they
read as."""

from __future__ import annotations

import pytest

from delayservice.daemon import precise_guarantee_caveat
from delayservice.settings import Settings


@pytest.mark.parametrize(
    ("precise", "guarantee", "replicas", "warned"),
    [
        (True, "exactly-once", 2, True),
        (True, "exactly-once", 1, False),
        (True, "at-least-once", 2, False),
        (False, "exactly-once", 2, False),
    ],
)
def test_exactly_once_with_two_precise_copies_says_a_takeover_may_deliver_twice(
    precise: bool, guarantee: str, replicas: int, warned: bool
) -> None:
    settings = Settings(
        bootstrap_servers="127.0.0.1:9",
        precise=precise,
        guarantee=guarantee,
        replicas=replicas,
        precise_members=2,
    )
    caveat = precise_guarantee_caveat(settings)
    assert (caveat is not None) is warned
    assert not warned or "takes over" in (caveat or "")
