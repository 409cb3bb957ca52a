"""An unusable `data_dir` is a configuration error: `delayservice run` stops before it
looks for the broker, with one line and exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from delayservice.errors import ConfigError
from delayservice.ports import free_port
from delayservice.precise.storage.data_dir import check_data_dir
from tests.ci import IN_CI


def _run(data_dir: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DELAYSERVICE_")}
    env = {
        **clean,
        "DELAYSERVICE_PRECISE": "true",
        "DELAYSERVICE_DATA_DIR": str(data_dir),
        "DELAYSERVICE_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",  # nobody listens
        "DELAYSERVICE_METRICS_HOST": "127.0.0.1",
        "DELAYSERVICE_METRICS_PORT": str(free_port()),
    }
    run = [sys.executable, "-m", "delayservice", "run"]
    return subprocess.run(run, env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A read-only file system (a tmpfs mounted `ro`; needs root)."""
    mount = tmp_path / "ro"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if made.returncode != 0:
        if IN_CI:
            pytest.fail(f"cannot mount a tmpfs: {made.stderr!r}")
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr!r}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def _refused(result: subprocess.CompletedProcess[str], why: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "invalid setting data_dir" in lines[0]
    assert why in lines[0]


def test_a_data_dir_that_is_a_file_exits_2_in_one_line(tmp_path):
    path = tmp_path / "a-file"
    path.write_text("not a directory\n")
    _refused(_run(path), "not a directory")


def test_a_data_dir_below_a_file_exits_2_in_one_line(tmp_path):
    (tmp_path / "a-file").write_text("")
    _refused(_run(tmp_path / "a-file" / "data"), "Not a directory")


def test_a_data_dir_on_a_read_only_file_system_exits_2_in_one_line(read_only):
    _refused(_run(read_only / "data"), "Read-only file system")
    _refused(_run(read_only), "Read-only file system")


def test_a_usable_data_dir_is_created_and_left_clean(tmp_path):
    data = tmp_path / "new" / "data"
    check_data_dir(data)
    assert data.is_dir()
    assert list(data.iterdir()) == []


def test_a_full_data_dir_is_refused(tmp_path, monkeypatch):
    def full(_fd: int, _data: bytes) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(ConfigError, match=r"data_dir: .* is not usable: No space left"):
        check_data_dir(tmp_path)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
