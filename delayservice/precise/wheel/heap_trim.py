"""Giving freed heap back to the operating system after a burst of intake.

Reading a backlog allocates and frees a lot: the Kafka client's fetch buffers, each
batch's messages and frames. glibc keeps what was freed in per-thread arenas (64 MiB
heaps that it rarely shrinks): after the intake of a million far-future records the
daemon was 102 MiB larger, and 1 MiB larger once restarted on the same data. The
wheel's state for them is small; the rest was freed heap. `malloc_trim` returns every
whole free page of every arena; the splitter thread calls it every second (about a
millisecond each), so resident memory follows what is really held.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where there is none (musl, not Linux)."""
    try:
        func = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_size_t]
    func.restype = ctypes.c_int
    return func


def release_free_heap() -> bool:
    """Return the free pages of the C heap to the system; False where unsupported."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
