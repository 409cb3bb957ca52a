"""The directory of slot files: `root/p{partition}/{second}.slot` plus an `origin` marker,
and span files `root/p{partition}/{start}_{width}.span` for records further out (see
`tiers`).

A file, slot or span, is only ever appended to or deleted whole; nothing is
rewritten, and a crash can only leave a torn tail, which `slot_file` detects. Appends
go to the page cache and `sync` makes them durable in one pass, so the intake thread
can commit Kafka offsets once per batch rather than per record.

Two threads share a store: the intake thread appends and syncs, the forwarder reads
and deletes. State sits behind one lock; the slow parts (fsync, reading a whole slot)
run outside it on duplicated descriptors or size snapshots, so a sync never holds up
the forwarder and a big read never holds up the intake. A second lock only makes
concurrent `sync` calls wait for each other, so none returns before data are durable.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Final

from delayservice.precise.storage.durable_io import fsync_path as _fsync_path
from delayservice.precise.storage.durable_io import syncfs as _syncfs
from delayservice.precise.storage.durable_io import write_all as _write_all
from delayservice.precise.storage.slot_file import StoredRecord, decode
from delayservice.precise.storage.slot_layout import (
    ORIGIN,
    ORIGIN_TMP,
    Key,
    file_name,
    partition_dirs,
    valid_prefix,
)
from delayservice.precise.storage.storage_fault import StorageError, ignore, reported

__all__ = ["Key", "SlotStore", "SlotStoreError", "partition_dirs"]

log = logging.getLogger(__name__)

OPEN_FILES: Final = 512
"""Append descriptors kept open: at least the span files a batch of far-future records
touches (the tiers bound them at about 125 per partition), so a batch reopens few."""
SYNCFS_ABOVE: Final = 32
"""More touched files than this and one `syncfs` beats an fsync per file."""


class SlotStoreError(StorageError):
    """The slot directory could not be read or written; the message names the path."""


def _fail(action: str, path: Path, exc: OSError, *, retriable: bool = True) -> SlotStoreError:
    return SlotStoreError(f"cannot {action} {path}: {exc}", retriable=retriable)


class SlotStore:
    def __init__(
        self,
        root: Path,
        open_files: int = OPEN_FILES,
        on_fault: Callable[[StorageError], None] = ignore,
    ) -> None:
        """`on_fault` hears of every storage fault, on whatever thread (see `reported`)."""
        if open_files < 1:
            raise ValueError(f"open_files must be >= 1, got {open_files}")
        self._root = root
        self._open_files = open_files
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._handles: OrderedDict[Key, int] = OrderedDict()  # LRU of append descriptors
        self._sizes: dict[Key, int] = {}  # every slot file and its size
        self._born: dict[Key, int] = {}  # every slot file: which one of that name it is
        self._births = itertools.count()
        self._bytes = 0
        self._sorted: list[tuple[int, int]] | None = None
        self._checked: set[Key] = set()  # tail known to be clean in this process
        self._partitions: set[int] = set()  # directories known to exist
        self._origins: dict[int, int | None] = {}
        self._dirty: set[Key] = set()  # appended since the last sync
        self._dirty_dirs: set[int] = set()  # entries added or removed since the last sync
        self._dirty_root = False
        self._closed = False
        self.on_fault = on_fault
        try:
            root.mkdir(parents=True, exist_ok=True)
            self._scan()
        except OSError as exc:
            raise _fail("open slot directory", root, exc) from exc

    def _scan(self) -> None:
        for partition, entries in partition_dirs(self._root):
            self._partitions.add(partition)
            for key, _path, size in entries:
                self._sizes[key] = size
                self._born[key] = next(self._births)
                self._bytes += size

    def _path(self, partition: int, second: int, width: int = 1) -> Path:
        return self._root / f"p{partition}" / file_name(second, width)

    def _check_open(self) -> None:
        if self._closed:
            raise SlotStoreError("slot store is closed")

    def _set_size(self, key: Key, size: int) -> None:
        self._bytes += size - self._sizes.get(key, 0)
        if key not in self._sizes:
            self._sorted = None
            self._born[key] = next(self._births)
        self._sizes[key] = size

    def _forget(self, key: Key) -> None:
        self._bytes -= self._sizes.pop(key, 0)
        self._born.pop(key, None)
        self._sorted = None

    def _close_handle(self, key: Key) -> None:
        fd = self._handles.pop(key, None)
        if fd is not None:
            os.close(fd)  # data stay in the page cache; `sync` reopens by path if dirty

    def _repair_tail(self, key: Key, fd: int, path: Path) -> None:
        """Cut a torn tail from a file written before this process, so new frames follow
        the last whole record instead of hiding behind garbage. Frames are walked by
        their headers and checksums, a chunk at a time: a big span costs a read, not a
        parse nor its size in memory."""
        size = os.fstat(fd).st_size
        if size:
            valid = valid_prefix(path, size)
            if valid < size:
                log.warning("truncating torn tail of %s: %d bytes dropped", path, size - valid)
                os.ftruncate(fd, valid)
                self._dirty.add(key)
                size = valid
        self._set_size(key, size)
        self._checked.add(key)

    def _handle(self, partition: int, second: int, width: int = 1) -> int:
        key = (partition, second, width)
        fd = self._handles.get(key)
        if fd is not None:
            self._handles.move_to_end(key)
            return fd
        if partition not in self._partitions:
            (self._root / f"p{partition}").mkdir(exist_ok=True)
            self._partitions.add(partition)
            self._dirty_root = True
        path = self._path(partition, second, width)
        if key not in self._sizes:
            self._dirty_dirs.add(partition)  # a new directory entry to make durable
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if key not in self._checked:
                self._repair_tail(key, fd, path)
        except BaseException:
            os.close(fd)
            raise
        self._handles[key] = fd
        while len(self._handles) > self._open_files:
            self._close_handle(next(iter(self._handles)))
        return fd

    @reported
    def append(self, partition: int, second: int, frames: bytes, width: int = 1) -> None:
        """Add framed records to a slot (or a span of `width` seconds starting at
        `second`). Not durable until `sync`."""
        if partition < 0:
            raise ValueError(f"partition must be >= 0, got {partition}")
        with self._lock:
            self._append_locked((partition, second, width), frames)

    def file_id(self, partition: int, second: int) -> int | None:
        """Which file of that slot's name is there now (None: none): a file deleted and
        made again under the same name is another file."""
        with self._lock:
            self._check_open()
            return self._born.get((partition, second, 1))

    @reported
    def append_to(self, partition: int, second: int, file_id: int, frames: bytes) -> bool:
        """`append` to a slot's file only if it is still the file `file_id` names;
        False, and nothing written, once that file was deleted (settled marks written
        after the wheel let go of its lock: they must not make a deleted slot come
        back, nor land in a new file of the same name)."""
        key = (partition, second, 1)
        with self._lock:
            if self._born.get(key) != file_id:
                self._check_open()
                return False
            self._append_locked(key, frames)
        return True

    @reported
    def append_many(self, writes: dict[Key, list[bytes]]) -> list[Key]:
        """Append each file's frames in one write per file, under one hold of the lock;
        returns the files this created. Not durable until `sync`. A failure leaves
        the files written before it as they are: not yet durable, and the caller
        commits nothing of the batch."""
        created: list[Key] = []
        with self._lock:
            for key, parts in writes.items():
                if key[0] < 0:
                    raise ValueError(f"partition must be >= 0, got {key[0]}")
                if key not in self._sizes:
                    created.append(key)
                self._append_locked(key, b"".join(parts))
        return created

    def _append_locked(self, key: Key, frames: bytes) -> None:
        self._check_open()
        try:
            fd = self._handle(*key)
        except OSError as exc:
            raise _fail("open slot", self._path(*key), exc) from exc
        self._dirty.add(key)
        before = self._sizes[key]
        try:
            _write_all(fd, frames)
        except OSError as exc:
            self._undo_write(key, fd, before)
            raise _fail("append to slot", self._path(*key), exc) from exc
        self._set_size(key, before + len(frames))

    def _undo_write(self, key: Key, fd: int, before: int) -> None:
        """Take a partial write back, or failing that make the next append re-check."""
        try:
            os.ftruncate(fd, before)
        except OSError:
            self._checked.discard(key)
        self._close_handle(key)
        try:
            self._set_size(key, self._path(*key).stat().st_size)
        except OSError:
            self._set_size(key, before)

    @reported
    def sync(self) -> None:
        """Make every append since the last sync durable, new directory entries included.

        An fsync failure is not retriable: Linux may drop the failed pages from the
        cache and report success on the next try, so only a restart that re-reads
        from the last committed offset is safe.
        """
        with self._sync_lock:
            if self._sync_many():
                return
            fds, paths, dirs = self._take_dirty()
            try:
                if len(fds) + len(paths) > SYNCFS_ABOVE and self._syncfs_all():
                    return
                for fd, path in fds:
                    try:
                        os.fsync(fd)
                    except OSError as exc:
                        raise _fail("fsync", path, exc, retriable=False) from exc
                for path in [*paths, *dirs]:
                    try:
                        _fsync_path(path)
                    except OSError as exc:
                        raise _fail("fsync", path, exc, retriable=False) from exc
            finally:
                for fd, _ in fds:
                    os.close(fd)

    def _sync_many(self) -> bool:
        """Many touched files (a batch of far-future records): one `syncfs`, without
        a descriptor per file. False when there are few, or no `syncfs`."""
        with self._lock:
            if len(self._dirty) <= SYNCFS_ABOVE or _syncfs() is None:
                return False
            self._dirty.clear()
            self._dirty_dirs.clear()
            self._dirty_root = False
        if not self._syncfs_all():
            os.sync()  # no syncfs after all: every file system, still durable
        return True

    def _take_dirty(self) -> tuple[list[tuple[int, Path]], list[Path], list[Path]]:
        """Swap out the dirty sets: duplicates of open descriptors (so eviction cannot
        close one under the fsync), paths of closed ones, and directories."""
        with self._lock:
            fds: list[tuple[int, Path]] = []
            paths: list[Path] = []
            try:
                for key in self._dirty:
                    fd = self._handles.get(key)
                    if fd is None:
                        paths.append(self._path(*key))
                    else:
                        fds.append((os.dup(fd), self._path(*key)))
            except OSError as exc:
                for fd, _ in fds:
                    os.close(fd)
                raise _fail("duplicate descriptor for", self._root, exc) from exc
            dirs = [self._root / f"p{partition}" for partition in self._dirty_dirs]
            if self._dirty_root:
                dirs.append(self._root)
            self._dirty.clear()
            self._dirty_dirs.clear()
            self._dirty_root = False
            return fds, paths, dirs

    def _syncfs_all(self) -> bool:
        """One `syncfs` for the whole filesystem; False when unavailable, so the caller
        falls back to fsync per file. Kernels before Linux 5.8 do not report write-back
        errors through `syncfs`, so there this path can miss a failed write."""
        syncfs = _syncfs()
        if syncfs is None:
            return False
        try:
            fd = os.open(self._root, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise _fail("open", self._root, exc, retriable=False) from exc
        try:
            if syncfs(fd) == 0:
                return True
            code = ctypes.get_errno()
            if code == errno.ENOSYS:
                return False
            raise _fail("syncfs", self._root, OSError(code, os.strerror(code)), retriable=False)
        finally:
            os.close(fd)

    def slots(self) -> list[tuple[int, int]]:
        """Every existing slot as (second, partition), earliest first."""
        with self._lock:
            if self._sorted is None:
                self._sorted = sorted(
                    (second, partition) for partition, second, width in self._sizes if width == 1
                )
            return list(self._sorted)

    def file_count(self) -> int:
        """Slot and span files on disk."""
        with self._lock:
            return len(self._sizes)

    def spans(self) -> list[Key]:
        """Every existing span file as (partition, start, width)."""
        with self._lock:
            return [key for key in self._sizes if key[2] != 1]

    def files(self, partition: int) -> list[tuple[Key, int]]:
        """Every file of `partition`, slot or span, with its size now."""
        with self._lock:
            return [(key, size) for key, size in self._sizes.items() if key[0] == partition]

    def earliest(self) -> dict[int, int]:
        """Per partition, the first second of its earliest file, slot or span. One pass
        over the files, whose number the tiers bound."""
        earliest: dict[int, int] = {}
        with self._lock:
            for partition, start, _ in self._sizes:
                if start < earliest.get(partition, start + 1):
                    earliest[partition] = start
        return earliest

    def size(self, partition: int, second: int, width: int = 1) -> int | None:
        """Bytes appended to a file so far, or None when it does not exist."""
        with self._lock:
            self._check_open()
            return self._sizes.get((partition, second, width))

    @reported
    def read_at(self, key: Key, position: int, length: int) -> bytes:
        """`length` bytes of a file from `position` (fewer at its end; b"" once it is
        gone): a chunk of a span being split, or of a slot being loaded."""
        path = self._path(*key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return b""
        except OSError as exc:
            raise _fail("read", path, exc) from exc
        try:
            return os.pread(fd, length, position)
        except OSError as exc:
            raise _fail("read", path, exc) from exc
        finally:
            os.close(fd)

    @reported
    def read(self, partition: int, second: int, size: int | None = None) -> list[StoredRecord]:
        """The whole records of a slot (of its first `size` bytes when given: a snapshot
        taken earlier by `size()`); [] when it does not exist."""
        path = self._path(partition, second)
        if size is None:
            size = self.size(partition, second)
        if size is None:
            return []
        try:
            with open(path, "rb") as file:
                data = file.read(size)  # appends after the snapshot wait for the next read
        except FileNotFoundError:
            return []  # deleted meanwhile
        except OSError as exc:
            raise _fail("read slot", path, exc) from exc
        records, valid = decode(data)
        if valid < len(data):
            log.warning("torn tail in %s: %d bytes dropped", path, len(data) - valid)
        return records

    @reported
    def delete(self, partition: int, second: int, width: int = 1) -> None:
        """Remove a file whole: a slot once every record in it has been settled, a span
        once its records are durable in finer files."""
        key = (partition, second, width)
        path = self._path(partition, second, width)
        with self._lock:
            self._check_open()
            if key not in self._sizes:
                return
            self._close_handle(key)
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                raise _fail("delete slot", path, exc) from exc
            self._forget(key)
            self._checked.discard(key)
            self._dirty.discard(key)
            self._dirty_dirs.add(partition)  # so a synced delete stays deleted

    @reported
    def origin(self, partition: int) -> int | None:
        """The offset stored by `set_origin` for a partition, or None if never set."""
        with self._lock:
            if partition in self._origins:
                return self._origins[partition]
            path = self._root / f"p{partition}" / ORIGIN
            try:
                text = path.read_text(encoding="ascii")
            except FileNotFoundError:
                value = None
            except (OSError, UnicodeDecodeError) as exc:
                raise SlotStoreError(f"cannot read {path}: {exc}", retriable=True) from exc
            else:
                try:
                    value = int(text.strip())
                except ValueError as exc:
                    raise SlotStoreError(f"{path} holds no offset: {text[:40]!r}") from exc
            self._origins[partition] = value
            return value

    @reported
    def set_origin(self, partition: int, offset: int) -> None:
        """Store a partition's offset durably before returning: write aside, rename over."""
        if partition < 0:
            raise ValueError(f"partition must be >= 0, got {partition}")
        directory = self._root / f"p{partition}"
        path = directory / ORIGIN
        with self._lock:
            self._check_open()
            try:
                if partition not in self._partitions:
                    directory.mkdir(exist_ok=True)
                    self._partitions.add(partition)
                    _fsync_path(self._root)
                tmp = directory / ORIGIN_TMP
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
                try:
                    _write_all(fd, f"{offset}\n".encode())
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, path)
                _fsync_path(directory)
            except OSError as exc:
                raise _fail("write", path, exc) from exc
            self._origins[partition] = offset

    def disk_bytes(self) -> int:
        """Total bytes in slot files, torn tails included until they are cut."""
        with self._lock:
            return self._bytes

    def close(self) -> None:
        """Release every descriptor. Does not sync: call `sync` first to keep appends."""
        with self._lock:
            self._closed = True
            while self._handles:
                self._close_handle(next(iter(self._handles)))
