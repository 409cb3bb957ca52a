"""The install paths the README and docs/operations.md give, run as written: a wheel
built with `python -m build`, installed into a fresh virtual environment, with the
compiled fast path and without; and the systemd install steps under a temporary root.

The wheels need setuptools and Cython from the package index (build isolation), and
the fresh environments the package's dependencies: what `pip install` needs anywhere.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.markdown import ROOT, blocks

VERSION = "delayservice 0.1.0"
PRODUCER_IMPORT = (
    "import sys; from delayservice import AsyncDelayProducer, DelayProducer; "
    "from delayservice.forward import speedups; "
    "print('compiled' if speedups.compiled_fast_path() else 'interpreted'); "
    "print('pyspark' in sys.modules)"
)


def run(*args: str | Path, env: dict[str, str] | None = None, cwd: Path = ROOT) -> str:
    result = subprocess.run(
        [str(a) for a in args],
        env={**os.environ, **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, f"{args}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def build_wheel(out: Path, **env: str) -> Path:
    """`python -m build --wheel`, as the README says, into `out`."""
    run(sys.executable, "-m", "build", "--wheel", "--outdir", out, env=env)
    (wheel,) = out.glob("delayservice-0.1.0-*.whl")
    return wheel


@pytest.fixture(scope="module")
def compiled_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("dist"), DELAYSERVICE_PURE_PYTHON="0")


@pytest.fixture(scope="module")
def pure_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("dist"), DELAYSERVICE_PURE_PYTHON="1")


def fresh_venv(path: Path) -> Path:
    """A virtual environment of the interpreter under this one's, with nothing in it."""
    run(getattr(sys, "_base_executable", sys.executable), "-m", "venv", path)
    return path / "bin"


def test_a_pure_wheel_installs_the_sdk_and_the_cli_alone(pure_wheel, tmp_path):
    assert pure_wheel.name.endswith("-py3-none-any.whl")
    bin_dir = fresh_venv(tmp_path / "venv")
    run(bin_dir / "pip", "install", "-q", "--disable-pip-version-check", pure_wheel)
    # Run away from the checkout, so nothing is imported from its source tree.
    assert run(bin_dir / "delayservice", "--version", cwd=tmp_path).strip() == VERSION
    imported = run(bin_dir / "python", "-c", PRODUCER_IMPORT, cwd=tmp_path)
    assert imported.split() == ["interpreted", "False"]
    # Optional parts stay optional: no PySpark, and the audit says how to get it.
    installed = run(bin_dir / "pip", "list", "--format=freeze").lower()
    assert "pyspark" not in installed
    assert "testcontainers" not in installed
    audit = subprocess.run(
        [bin_dir / "delayservice", "audit", "--since", "1h"],
        env={k: v for k, v in os.environ.items() if not k.startswith("DELAYSERVICE_")},
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert audit.returncode != 0
    assert "pip install '.[audit]'" in audit.stderr


def install_steps() -> str:
    """The systemd install block of docs/operations.md, as written."""
    (block,) = [b for b in blocks(ROOT / "docs" / "operations.md") if "useradd" in b.body]
    return block.body


STUBS = {
    # Accounts, services and logs belong to the real machine: noted, not done.
    "useradd": 'echo "useradd $*" >> "$STUB_LOG"',
    "systemctl": 'echo "systemctl $*" >> "$STUB_LOG"',
    "journalctl": 'echo "journalctl $*" >> "$STUB_LOG"',
    # The group does not exist under a temporary root: everything else install does.
    "install": (
        'args=(); while [ $# -gt 0 ]; do case "$1" in -g|-o) shift 2;; '
        '*) args+=("$1"); shift;; esac; done; exec /usr/bin/install "${args[@]}"'
    ),
    "python3": f'exec "{getattr(sys, "_base_executable", sys.executable)}" "$@"',
}


def test_the_systemd_install_steps_run_as_written(compiled_wheel, tmp_path):
    root = tmp_path / "root"
    (root / "etc" / "systemd" / "system").mkdir(parents=True)  # as on any systemd host
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, body in STUBS.items():
        (stubs / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (stubs / name).chmod(0o755)
    steps = install_steps()
    # The one rewrite: absolute paths land under the temporary root, the wheel in its dir.
    script = re.sub(r"(?<![\w./-])/(etc|opt|var)/", f"{root}/\\1/", steps)
    script = script.replace("dist/", f"{compiled_wheel.parent}/")
    log = tmp_path / "stubs.log"
    run(
        "bash", "-euo", "pipefail", "-c", script,
        env={"PATH": f"{stubs}:{os.environ['PATH']}", "STUB_LOG": str(log)},
    )  # fmt: skip

    etc = root / "etc" / "delayservice"
    assert oct(etc.stat().st_mode & 0o777) == "0o750"
    for name in ("delayservice.env", "delayservice.toml"):
        assert oct((etc / name).stat().st_mode & 0o777) == "0o640", name
    unit = root / "etc" / "systemd" / "system" / "delayservice.service"
    assert unit.read_text() == (ROOT / "deploy" / "systemd" / "delayservice.service").read_text()
    assert log.read_text().splitlines() == [
        "useradd --system --no-create-home --shell /usr/sbin/nologin delayservice",
        "systemctl daemon-reload",
        "systemctl enable --now delayservice",
        "journalctl -u delayservice -f",
    ]
    # What the unit starts exists, and starts from what was installed.
    (exec_start,) = [s for s in unit.read_text().splitlines() if s.startswith("ExecStart=")]
    binary = Path(str(root) + exec_start.removeprefix("ExecStart=").split()[0])
    assert run(binary, "--version", cwd=tmp_path).strip() == VERSION
    python = binary.with_name("python")
    assert run(python, "-c", PRODUCER_IMPORT, cwd=tmp_path).split() == ["compiled", "False"]
    settings = {
        k: v.replace("/etc/", f"{root}/etc/")
        for k, _, v in (
            line.partition("=")
            for line in (etc / "delayservice.env").read_text().splitlines()
            if line and not line.startswith("#")
        )
    }
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DELAYSERVICE_")}
    shown = subprocess.run(
        [binary, "settings"], env={**clean, **settings},
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert 'bootstrap_servers = "127.0.0.1:9092"' in shown.stdout
