"""A durable map from message ids to a few integers, the storage under the cancel log
and the reschedule log.

Both keep what a record asked of a message that may still be hours or months from
due, so it has to outlive restarts until it can no longer matter. The file is
append-only text, one change per line, so a crash can only tear the last line:

    + {integer} ... {hex of the id's UTF-8}
    - {hex of the id's UTF-8}

Ids are hex-encoded because they are arbitrary header text; spaces or newlines in an
id must not be able to forge a line. When dead lines pile up the file is rewritten
whole (write aside, fsync, rename), so it stays proportional to the live set.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import ClassVar, Final

from delayservice.precise.storage.durable_io import fsync_path as _fsync_path
from delayservice.precise.storage.durable_io import write_all as _write_all
from delayservice.precise.storage.storage_fault import StorageError, ignore

log = logging.getLogger(__name__)

COMPACT_MIN_DEAD: Final = 10_000
COMPACT_RATIO: Final = 2
_CODEC: Final = "surrogatepass"  # any Python str round-trips, even lone surrogates

Values = tuple[int, ...]


class IdLogError(StorageError):
    """The file could not be read or written; the message names the path."""


def _hex(message_id: str) -> str:
    return message_id.encode("utf-8", _CODEC).hex()


def _unhex(text: str) -> str:
    return bytes.fromhex(text).decode("utf-8", _CODEC)


def _parse(line: bytes, width: int) -> tuple[str, Values | None]:
    """(id, values) for an add, (id, None) for a removal. Raises ValueError if bad."""
    parts = line.decode("ascii").split(" ")
    if parts[0] == "+" and len(parts) == width + 2:
        return _unhex(parts[-1]), tuple(int(part) for part in parts[1:-1])
    if parts[0] == "-" and len(parts) == 2:
        return _unhex(parts[1]), None
    raise ValueError("unknown line")


def _add_line(message_id: str, values: Values) -> str:
    return f"+ {' '.join(map(str, values))} {_hex(message_id)}\n"


def _drop_line(message_id: str) -> str:
    return f"- {_hex(message_id)}\n"


def replay(data: bytes, entries: dict[str, Values], width: int) -> tuple[int, int, int]:
    """Apply a file's whole lines to `entries`; returns where the whole lines end, how
    many there were and how many could not be read."""
    end = data.rfind(b"\n") + 1
    lines = bad = 0
    for line in data[:end].split(b"\n")[:-1]:
        lines += 1
        try:
            message_id, values = _parse(line, width)
        except ValueError:
            bad += 1
            continue
        if values is None:
            entries.pop(message_id, None)
        else:
            entries[message_id] = values
    return end, lines, bad


def read_entries(path: Path, width: int) -> dict[str, Values]:
    """What a file holds, read without changing it (for a census beside a running
    daemon, which owns the file)."""
    entries: dict[str, Values] = {}
    with contextlib.suppress(FileNotFoundError):
        replay(path.read_bytes(), entries, width)
    return entries


class IdLog:
    """The file and the live map; subclasses say what the integers mean. Every method
    that touches the file holds `_lock`, which subclasses share for their own state."""

    width: ClassVar[int] = 1
    error: ClassVar[type[IdLogError]] = IdLogError
    noun: ClassVar[str] = "entries"

    def __init__(
        self,
        path: Path,
        max_entries: int = 1_000_000,
        on_fault: Callable[[StorageError], None] = ignore,
    ) -> None:
        """Load what an earlier process stored; `on_fault` hears of every storage fault
        (see `reported`)."""
        self._path = path
        self._max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: dict[str, Values] = {}
        self._lines = 0  # lines in the file, live or dead
        self._next_compact = 0  # line count before which compaction is not retried
        self._created = False  # the file's directory entry still needs an fsync
        self._dirty = False  # written since the last fsync
        self._fd = -1
        self.on_fault = on_fault
        try:
            self._size = self._load()
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise self.error(f"cannot open {path}: {exc}", retriable=True) from exc
        self._dirty = self._dirty or self._created

    def _load(self) -> int:
        """Replay the file; cut a torn last line so the next append starts clean."""
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            self._created = True
            return 0
        end, lines, bad = replay(data, self._entries, self.width)
        self._lines += lines
        if bad:
            log.warning("%s: skipped %d unreadable lines", self._path, bad)
        if end < len(data):
            log.warning("%s: torn last line, %d bytes dropped", self._path, len(data) - end)
            os.truncate(self._path, end)
            self._dirty = True  # the cut needs the next sync too
        return end

    def _append(self, text: str) -> None:
        """Write lines at the end; a partial write is cut off so no line is ever glued
        onto half of another (lock held)."""
        self._check_open()
        data = text.encode("ascii")
        try:
            _write_all(self._fd, data)
        except OSError as exc:
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                log.warning("%s: cannot cut a partial write", self._path, exc_info=True)
            raise self.error(f"cannot append to {self._path}: {exc}", retriable=True) from exc
        self._size += len(data)
        self._lines += text.count("\n")
        self._dirty = True

    def _put(self, message_id: str, values: Values) -> bool:
        """Store `values` for `message_id`; False, storing nothing, when full (lock held)."""
        if message_id not in self._entries and len(self._entries) >= self._max_entries:
            return False
        self._append(_add_line(message_id, values))
        self._entries[message_id] = values
        return True

    def _drop(self, message_ids: list[str]) -> None:
        """Forget entries, in one write (lock held)."""
        gone = [m for m in message_ids if m in self._entries]
        if gone:
            self._append("".join(map(_drop_line, gone)))
            for message_id in gone:
                del self._entries[message_id]

    def among(self, message_ids: Iterable[str]) -> set[str]:
        """Which of `message_ids` have an entry, under one hold of the lock."""
        with self._lock:
            entries = self._entries
            return {m for m in message_ids if m in entries} if entries else set()

    def __contains__(self, message_id: object) -> bool:
        """Without the lock: one dict lookup is atomic, and it runs once per record the
        intake reads, where taking the lock cost a tenth of a microsecond each."""
        return message_id in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _sync(self) -> None:
        """Make every change so far durable, then compact the file if it is mostly dead
        lines. Subclasses expose it as `sync`, reported to `on_fault`."""
        with self._lock:
            self._check_open()
            if self._dirty:
                try:
                    os.fsync(self._fd)
                    if self._created:
                        _fsync_path(self._path.parent)
                except OSError as exc:  # not retriable: a retried fsync can lie after a failure
                    raise self.error(f"cannot fsync {self._path}: {exc}") from exc
                self._created = False
                self._dirty = False
            dead = self._lines - len(self._entries)
            if (
                dead > COMPACT_MIN_DEAD
                and dead > COMPACT_RATIO * len(self._entries)
                and self._lines >= self._next_compact
            ):
                self._compact()

    def _compact(self) -> None:
        """Rewrite the live set. Best effort: the changes are durable already, so a
        failure (a full disk) only waits for more dead lines before trying again."""
        tmp = self._path.with_name(self._path.name + ".tmp")
        data = "".join(_add_line(m, v) for m, v in self._entries.items()).encode("ascii")
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o644)  # stays the append descriptor after the rename
        except OSError as exc:
            self._compact_failed(exc)
            return
        try:
            _write_all(fd, data)
            os.fsync(fd)
            os.replace(tmp, self._path)
        except OSError as exc:
            os.close(fd)
            self._compact_failed(exc)
            return
        os.close(self._fd)
        self._fd = fd
        self._size = len(data)
        self._lines = len(self._entries)
        try:
            _fsync_path(self._path.parent)
        except OSError:
            self._created = self._dirty = True  # the rename is durable only at the next sync
            log.warning("%s: cannot fsync the directory after compaction", self._path)
        log.info("%s: compacted to %d live %s", self._path, len(self._entries), self.noun)

    def _compact_failed(self, exc: OSError) -> None:
        self._next_compact = self._lines + COMPACT_MIN_DEAD
        log.warning("%s: cannot compact (%s), will retry later", self._path, exc)

    def close(self) -> None:
        """Release the file. Does not sync: call `sync` first to keep recent changes."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def _check_open(self) -> None:
        if self._fd < 0:
            raise self.error(f"{self.noun} log {self._path} is closed")
