"""Busy processes beside a benchmark: on a 2-vCPU machine the daemon rarely has a
core to itself in production, and lateness measured on a quiet machine flatters it."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """`count` interpreters spinning in a loop for as long as the block runs."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()
