"""Where a restart reads the done topic from: the topic's end, noted beside the slot
files (`{data_dir}/{topic}.delivered`) once no record before it is needed again
(`DeliveryLog.note_position`). A note that is missing or does not read back whole
only makes the restart read the topic from its start.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path


def delivered_position_path(data_dir: Path, topic: str) -> Path:
    return data_dir / f"{topic}.delivered"


def write_position(path: Path, offset: int) -> None:
    """Note `offset` (to the page cache; a machine crash may leave the old one or none,
    and a restart then reads more)."""
    spare = path.with_name(path.name + ".new")
    spare.write_text(f"{offset} {zlib.crc32(str(offset).encode())}\n", encoding="ascii")
    os.replace(spare, path)


def read_position(path: Path | None) -> int | None:
    """The offset noted, or None when there is none or it does not read back whole."""
    if path is None:
        return None
    try:
        offset, crc = path.read_text(encoding="ascii").split()
        if zlib.crc32(offset.encode()) != int(crc):
            return None
        return int(offset)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
