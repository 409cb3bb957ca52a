"""The few file-system calls durability rests on, shared by the slot store and the id
logs: a write that writes everything, an fsync by path (directories included), and
Linux's `syncfs` for when many files were touched at once."""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from pathlib import Path


def write_all(fd: int, data: bytes) -> None:
    """`os.write` until every byte is written (a write may be partial)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_path(path: Path, flags: int = os.O_RDONLY) -> None:
    """fsync a file or a directory by path; a file deleted meanwhile needs no sync."""
    try:
        fd = os.open(path, flags | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@functools.cache
def syncfs() -> Callable[[int], int] | None:
    """libc's `syncfs`, or None where there is none (not Linux, no glibc)."""
    try:
        func = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int]
    func.restype = ctypes.c_int
    return func
