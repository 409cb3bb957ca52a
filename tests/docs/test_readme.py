"""The README is the front door: every link it and the docs hold must lead somewhere,
and every command it names must exist with the options it shows."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from delayservice.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"```bash\n(.*?)```", re.DOTALL)


def _relative_links(page: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(page.read_text())
        if not re.match(r"^[a-z]+:", target) and not target.startswith("#")
    ]


def _bash_lines(page: Path) -> list[str]:
    lines = []
    for block in FENCE.findall(page.read_text()):
        for line in block.splitlines():
            command = line.split(" #", 1)[0].strip()
            if command:
                lines.append(command)
    return lines


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    missing = [
        target
        for target in _relative_links(page)
        if not (page.parent / target.split("#", 1)[0]).exists()
    ]
    assert missing == [], f"{page.name} links to what does not exist"


def test_the_readme_links_every_docs_page() -> None:
    linked = {(README.parent / t).resolve() for t in _relative_links(README)}
    pages = set((ROOT / "docs").glob("*.md"))
    assert {p.resolve() for p in pages} - linked == set(), "docs pages the README never names"


def test_the_readme_stays_a_front_door() -> None:
    assert len(README.read_text().splitlines()) <= 260


def test_every_script_the_readme_runs_exists_and_is_executable() -> None:
    scripts = [line.split()[0] for line in _bash_lines(README) if line.startswith("./")]
    assert scripts, "the README names no script"
    for script in scripts:
        path = ROOT / script
        assert path.is_file(), script
        assert path.stat().st_mode & 0o111, f"{script} is not executable"


def _cli_lines() -> list[list[str]]:
    return [
        shlex.split(line)[1:] for line in _bash_lines(README) if line.startswith("delayservice")
    ]


def test_the_readme_names_cli_commands() -> None:
    assert len(_cli_lines()) >= 5


@pytest.mark.parametrize("words", _cli_lines(), ids=" ".join)
def test_every_cli_command_in_the_readme_exists_with_its_options(words: list[str]) -> None:
    path = []
    for word in words:
        if word.startswith("-"):
            break
        probe = CliRunner().invoke(app, [*path, word, "--help"])
        if probe.exit_code != 0:
            break  # an argument, not a sub-command
        path.append(word)
    if words and not words[0].startswith("-"):
        assert path, f"`delayservice {words[0]}` is not a command"
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    options = {word.split("=", 1)[0] for word in words if word.startswith("-")} - {"--help"}
    text = re.sub(r"\x1b\[[0-9;]*m", "", result.output)
    unknown = [option for option in options if not re.search(rf"(?<![\w-]){option}(?![\w-])", text)]
    assert unknown == [], f"`delayservice {' '.join(path)}` has no option {unknown}"
