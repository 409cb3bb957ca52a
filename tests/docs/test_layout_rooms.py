"""docs/layout.md lists every room of the package, one line each: a module or folder
added, moved or gone shows here before a reader meets a page that no longer matches."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "delayservice"
SECTION = "## The package's rooms, one line each"


def _listed() -> list[str]:
    text = (ROOT / "docs" / "layout.md").read_text()
    block = text.split(SECTION, 1)[1].split("```", 2)[1]
    return [m.group(1) for line in block.splitlines() if (m := re.match(r"(\S+)\s{2,}\S", line))]


def _rooms() -> set[str]:
    modules = {p.name for p in PACKAGE.glob("*.py")}
    folders = {f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    return modules | folders


def test_every_room_of_the_package_has_one_line() -> None:
    listed = _listed()
    assert len(listed) == len(set(listed)), f"listed twice: {sorted(listed)}"
    assert set(listed) == _rooms(), (
        f"missing: {sorted(_rooms() - set(listed))}; gone: {sorted(set(listed) - _rooms())}"
    )
