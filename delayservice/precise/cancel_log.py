"""A durable set of cancelled message ids.

A cancel arrives as a record and may name a message that is still hours from due,
so it has to outlive restarts: it stays until the message it names is removed
(`matched`) or until it can no longer match anything (`expire`). A cancel names a
message due at most `max_delay` after the cancel was appended, so the caller passes
that instant as the expiry.

The file is append-only text, one change per line, so a crash can only tear the last
line:

    + {expires_ms} {hex of the id's UTF-8}
    - {hex of the id's UTF-8}

Ids are hex-encoded because they are arbitrary header text; spaces or newlines in an
id must not be able to forge a line. When dead lines pile up the file is rewritten
whole (write aside, fsync, rename), so it stays proportional to the live set.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

from delayservice.precise.storage_fault import StorageError, ignore, reported

log = logging.getLogger(__name__)

COMPACT_MIN_DEAD: Final = 10_000
COMPACT_RATIO: Final = 2
_CODEC: Final = "surrogatepass"  # any Python str round-trips, even lone surrogates


class CancelLogError(StorageError):
    """The cancel file could not be read or written; the message names the path."""


def _hex(message_id: str) -> str:
    return message_id.encode("utf-8", _CODEC).hex()


def _unhex(text: str) -> str:
    return bytes.fromhex(text).decode("utf-8", _CODEC)


def _parse(line: bytes) -> tuple[str, int | None]:
    """(id, expiry) for an add, (id, None) for a removal. Raises ValueError if bad."""
    parts = line.decode("ascii").split(" ")
    if parts[0] == "+" and len(parts) == 3:
        return _unhex(parts[2]), int(parts[1])
    if parts[0] == "-" and len(parts) == 2:
        return _unhex(parts[1]), None
    raise ValueError("unknown line")


def replay(data: bytes, entries: dict[str, int]) -> tuple[int, int, int]:
    """Apply a cancel file's whole lines to `entries` (id -> expiry); returns where the
    whole lines end, how many there were and how many could not be read."""
    end = data.rfind(b"\n") + 1
    lines = bad = 0
    for line in data[:end].split(b"\n")[:-1]:
        lines += 1
        try:
            message_id, expires = _parse(line)
        except ValueError:
            bad += 1
            continue
        if expires is None:
            entries.pop(message_id, None)
        else:
            entries[message_id] = expires
    return end, lines, bad


def pending_cancels(path: Path) -> set[str]:
    """The ids a cancel file holds, read without changing it (for a census beside a
    running daemon, which owns the file)."""
    entries: dict[str, int] = {}
    with contextlib.suppress(FileNotFoundError):
        replay(path.read_bytes(), entries)
    return set(entries)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CancelLog:
    def __init__(self, path: Path, max_entries: int = 1_000_000) -> None:
        """Load what an earlier process stored. No clock here: expired entries stay
        until the first `expire`."""
        self._path = path
        self._max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: dict[str, int] = {}  # id -> expires_ms
        self._heap: list[tuple[int, str]] = []  # (expires_ms, id), stale rows skipped
        self._lines = 0  # lines in the file, live or dead
        self._next_compact = 0  # line count before which compaction is not retried
        self._created = False  # the file's directory entry still needs an fsync
        self._dirty = False  # written since the last fsync
        self._fd = -1
        self.on_fault: Callable[[StorageError], None] = ignore  # see `reported`
        try:
            self._size = self._load()
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise CancelLogError(f"cannot open {path}: {exc}", retriable=True) from exc
        self._dirty = self._dirty or self._created
        self._heap = [(expires, message_id) for message_id, expires in self._entries.items()]
        heapq.heapify(self._heap)

    def _load(self) -> int:
        """Replay the file; cut a torn last line so the next append starts clean."""
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            self._created = True
            return 0
        end, lines, bad = replay(data, self._entries)
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
        onto half of another."""
        self._check_open()
        data = text.encode("ascii")
        try:
            _write_all(self._fd, data)
        except OSError as exc:
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                log.warning("%s: cannot cut a partial write", self._path, exc_info=True)
            raise CancelLogError(f"cannot append to {self._path}: {exc}", retriable=True) from exc
        self._size += len(data)
        self._lines += text.count("\n")
        self._dirty = True

    @reported
    def add(self, message_id: str, expires_ms: int) -> bool:
        """Remember a cancel. False, storing nothing, when the log is full."""
        with self._lock:
            known = self._entries.get(message_id)
            if known is not None and known >= expires_ms:
                return True  # a redelivered cancel: nothing new to store
            if known is None and len(self._entries) >= self._max_entries:
                return False
            self._append(f"+ {expires_ms} {_hex(message_id)}\n")
            self._entries[message_id] = expires_ms
            heapq.heappush(self._heap, (expires_ms, message_id))
            return True

    def among(self, message_ids: Iterable[str]) -> set[str]:
        """Which of `message_ids` are called off, under one hold of the lock."""
        with self._lock:
            entries = self._entries
            return {m for m in message_ids if m in entries} if entries else set()

    def __contains__(self, message_id: object) -> bool:
        with self._lock:
            return message_id in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @reported
    def matched(self, message_id: str) -> None:
        """The cancel removed its message and can never be needed again."""
        with self._lock:
            if message_id in self._entries:
                self._append(f"- {_hex(message_id)}\n")
                del self._entries[message_id]

    @reported
    def expire(self, now_ms: int) -> list[str]:
        """Drop and return the cancels whose expiry is before `now_ms`.

        Strictly before: a message due exactly at the expiry may still be firing.
        """
        with self._lock:
            gone: list[str] = []
            while self._heap and self._heap[0][0] < now_ms:
                expires, message_id = heapq.heappop(self._heap)
                if self._entries.get(message_id) == expires:
                    gone.append(message_id)
            if gone:
                self._append("".join(f"- {_hex(message_id)}\n" for message_id in gone))
                for message_id in gone:
                    del self._entries[message_id]
            if len(self._heap) > 2 * len(self._entries) + 1024:  # drop stale rows
                self._heap = [(expires, mid) for mid, expires in self._entries.items()]
                heapq.heapify(self._heap)
            return gone

    @reported
    def sync(self) -> None:
        """Make every add and removal so far durable, then compact the file if it is
        mostly dead lines."""
        with self._lock:
            self._check_open()
            if self._dirty:
                try:
                    os.fsync(self._fd)
                    if self._created:
                        _fsync_dir(self._path.parent)
                except OSError as exc:  # not retriable: a retried fsync can lie after a failure
                    raise CancelLogError(f"cannot fsync {self._path}: {exc}") from exc
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
        data = "".join(
            f"+ {expires} {_hex(message_id)}\n" for message_id, expires in self._entries.items()
        ).encode("ascii")
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
            _fsync_dir(self._path.parent)
        except OSError:
            self._created = self._dirty = True  # the rename is durable only at the next sync
            log.warning("%s: cannot fsync the directory after compaction", self._path)
        log.info("%s: compacted to %d live cancels", self._path, len(self._entries))

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
            raise CancelLogError(f"cancel log {self._path} is closed")
