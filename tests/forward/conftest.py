"""The forwarder is tested through the level rig (`tests/level/fakes.py`): the same fake
clock and the same exactly-once ownership check."""

from tests.level.conftest import (
    _commits_only_what_is_owned,
    clock,
    fast_path_impl,
    pytest_generate_tests,
)

__all__ = ["_commits_only_what_is_owned", "clock", "fast_path_impl", "pytest_generate_tests"]
