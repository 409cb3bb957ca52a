"""This process's environment with chosen DELAYSERVICE_* variables only, for tests that
load settings as a daemon started with that environment would."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from delayservice.settings import ENV_PREFIX


@contextmanager
def only_these_settings(variables: dict[str, str]) -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    for key in saved:
        del os.environ[key]
    os.environ.update(variables)
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
            del os.environ[key]
        os.environ.update(saved)
