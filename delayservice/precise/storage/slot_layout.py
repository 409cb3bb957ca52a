"""Where a wheel's files are and what they are called: `root/p{partition}/{second}.slot`
for a slot, `root/p{partition}/{start}_{width}.span` for a span (see `tiers`), and an
`origin` marker per partition. Readers beside a running daemon (the census) walk a
directory the way the store does, through here; anything the store never writes is
logged and skipped, never touched.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from delayservice.precise.storage.slot_file import FRAME_OVERHEAD, frame_length, frames

log = logging.getLogger(__name__)

ORIGIN: Final = "origin"
ORIGIN_TMP: Final = "origin.tmp"
_SLOT_RE: Final = re.compile(r"-?[0-9]+\.slot")
_SPAN_RE: Final = re.compile(r"(-?[0-9]+)_([0-9]+)\.span")
_PARTITION_RE: Final = re.compile(r"p[0-9]+")
TAIL_CHUNK: Final = 8 * 1024 * 1024
"""Bytes read at a time when a file's torn tail is looked for."""

Key = tuple[int, int, int]  # (partition, first second, width in seconds; 1: a slot)


def partition_dirs(root: Path) -> Iterator[tuple[int, Iterator[tuple[Key, str, int]]]]:
    """Each partition directory under `root` with its slot and span files (key, path,
    size); anything this store never writes is logged and skipped, never touched."""
    for entry in root.iterdir():
        if not (entry.is_dir() and _PARTITION_RE.fullmatch(entry.name)):
            log.warning("ignoring unknown entry %s in the slot directory", entry)
            continue
        partition = int(entry.name[1:])
        if entry.name != f"p{partition}":  # p01 would never be written
            log.warning("ignoring unknown entry %s in the slot directory", entry)
            continue
        yield partition, _files(partition, entry)


def _files(partition: int, directory: Path) -> Iterator[tuple[Key, str, int]]:
    for file in os.scandir(directory):
        if file.name in (ORIGIN, ORIGIN_TMP):
            continue
        key = parse_name(partition, file.name)
        if key is None or not file.is_file():
            log.warning("ignoring unknown entry %s in the slot directory", file.path)
            continue
        try:
            size = file.stat().st_size
        except FileNotFoundError:  # deleted meanwhile (a reader beside a running daemon)
            continue
        yield key, file.path, size


def file_name(start: int, width: int) -> str:
    return f"{start}.slot" if width == 1 else f"{start}_{width}.span"


def parse_name(partition: int, name: str) -> Key | None:
    """The file a directory entry is, or None for anything this store never writes."""
    if _SLOT_RE.fullmatch(name):
        key = (partition, int(name[:-5]), 1)
    elif match := _SPAN_RE.fullmatch(name):
        key = (partition, int(match[1]), int(match[2]))
        if key[2] < 2:
            return None
    else:
        return None
    return key if file_name(key[1], key[2]) == name else None  # "05.slot" is never written


def valid_prefix(path: Path, size: int) -> int:
    """Length of the whole frames at the start of a file's first `size` bytes."""
    valid = 0
    with open(path, "rb") as file:
        while valid < size:
            file.seek(valid)
            head = file.read(FRAME_OVERHEAD)
            want = max(TAIL_CHUNK, frame_length(head) or 0)
            file.seek(valid)
            _, end = frames(file.read(min(size - valid, want)))
            if end == 0:
                break
            valid += end
    return valid
