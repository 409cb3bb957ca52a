"""One precise topic's data directory: its slot files, cancel log, reschedule log and
how far its intake got, held by one process.

Two wheels writing one directory would each delete the other's slot files, so the
directory is locked for the process's life. A directory removed or replaced under a
running daemon is noticed before any offset its writes cover is committed
(`DataDirWatch`), and one that cannot take a synced write is refused at start-up as a
setting to fix (`check_data_dir`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from delayservice.errors import ConfigError
from delayservice.precise.storage.cancel_log import CancelLog
from delayservice.precise.storage.intake_offsets import IntakeOffsets, intake_offsets_path
from delayservice.precise.storage.reschedule_log import RescheduleLog
from delayservice.precise.storage.slot_store import SlotStore
from delayservice.precise.storage.storage_fault import StorageError


def cancel_log_path(data_dir: Path, topic: str) -> Path:
    """Where the cancels of `topic` not yet matched are kept, beside its slot files."""
    return data_dir / f"{topic}.cancels.log"


def reschedule_log_path(data_dir: Path, topic: str) -> Path:
    """Where the moves of `topic` still needed are kept, beside its slot files."""
    return data_dir / f"{topic}.reschedules.log"


def lock_data_dir(root: Path) -> IO[str]:
    """Hold the wheel's directory for this process. The lock file sits beside it."""
    check_data_dir(root.parent)
    try:
        handle = (root.parent / f".{root.name}.lock").open("a")  # held for the process's life
    except OSError as exc:
        raise ConfigError("data_dir", f"{root.parent} is not usable: {exc}") from exc
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.close()
        raise ConfigError("data_dir", f"{root} is in use by another process") from exc
    return handle


def check_not_in_use(data_dir: Path, topics: tuple[str, ...]) -> None:
    """Refuse, as `DataDir` would, a wheel directory another process holds: at start-up,
    so that this is the line a second daemon on one directory stops with, not the
    later wait for its `precise_member` (`member_lease`). The lock is let go at once;
    `DataDir` takes it for good."""
    for topic in topics:
        lock_data_dir(data_dir / topic).close()


class DataDir:
    def __init__(
        self, data_dir: Path, topic: str, on_fault: Callable[[StorageError], None]
    ) -> None:
        """Lock and open what an earlier process left. An unusable directory is a
        setting to fix (`ConfigError`); `on_fault` hears of every later fault."""
        self.root = data_dir / topic
        self._lock = lock_data_dir(self.root)
        cancel_path = cancel_log_path(data_dir, topic)
        reschedule_path = reschedule_log_path(data_dir, topic)
        offsets_path = intake_offsets_path(data_dir, topic)
        try:
            self.store = SlotStore(self.root, on_fault=on_fault)
            self.cancels = CancelLog(cancel_path, on_fault=on_fault)
            self.reschedules = RescheduleLog(reschedule_path, on_fault=on_fault)
            self.intake_offsets = IntakeOffsets(offsets_path, on_fault=on_fault)
        except StorageError as fault:
            self._lock.close()
            raise ConfigError("data_dir", f"{data_dir} is not usable: {fault}") from fault
        self.check = DataDirWatch(self.root, cancel_path, reschedule_path, offsets_path).check
        """Raises `StorageError` once the directory is no longer the one opened."""

    def close(self) -> None:
        self.store.close()
        self.cancels.close()
        self.reschedules.close()
        self.intake_offsets.close()
        self._lock.close()


class DataDirWatch:
    """Notices a data directory removed (or replaced) under a running daemon.

    Descriptors opened before an `rm -rf` keep writing, and their fsyncs succeed, into
    files no directory names any more: a restart would find nothing. Checked after each
    sync and before the offsets it covers are committed.
    """

    def __init__(self, directory: Path, *files: Path) -> None:
        self._directory = directory
        self._files = files
        self._identity = self._stat(directory)

    @staticmethod
    def _stat(path: Path) -> tuple[int, int]:
        try:
            found = path.stat()
        except OSError as exc:
            raise StorageError(f"cannot find {path}: {exc.strerror or exc}") from exc
        return found.st_dev, found.st_ino

    def check(self) -> None:
        if self._stat(self._directory) != self._identity:
            raise StorageError(f"{self._directory} was replaced by another directory")
        for path in self._files:
            self._stat(path)


def check_data_dir(data_dir: Path) -> None:
    """Refuse a data directory precise mode cannot use, as a configuration error:
    one that cannot be created, is not a directory, or cannot take a synced write
    (read-only file system, no permission, full)."""
    try:
        if data_dir.exists() and not data_dir.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a directory")
        data_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=data_dir)
        try:
            os.write(fd, b"probe\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise ConfigError("data_dir", f"{data_dir} is not usable: {exc.strerror or exc}") from exc
