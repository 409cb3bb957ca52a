"""What the documentation tests read out of the README and docs/: fenced blocks, the
command lines in them, links, and the anchors GitHub gives headings."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
FRAGMENT_MARK = "<!-- fragment -->"
"""Put on the line before a ```python block that is a piece of a program, not one:
the examples test then leaves it alone. Every other Python block must run."""
SCRIPT_LANGUAGES = ("bash", "sh", "shell")
"""Blocks whose every line is a command; elsewhere only a `$ ` prompt marks one."""

_FENCE = re.compile(
    r"^(?P<indent> *)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```", re.M | re.S
)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    body: str
    fragment: bool

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        indent = len(match.group("indent"))
        body = "\n".join(line[indent:] for line in match.group("body").splitlines())
        found.append(
            Block(
                page=page,
                line=text.count("\n", 0, match.start()) + 1,
                language=match.group("info").strip().split(" ")[0],
                body=body + "\n",
                fragment=before == FRAGMENT_MARK,
            )
        )
    return found


def shell_lines(block: Block) -> list[str]:
    """The commands a block shows: in a shell block every line (continuations joined),
    in any other block (console, output) the lines after a `$ ` prompt."""
    joined = block.body.replace("\\\n", " ")
    lines = []
    for raw in joined.splitlines():
        line = raw.strip()
        if block.language not in SCRIPT_LANGUAGES:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def command_words(line: str) -> list[str]:
    """A shell line as the words the program gets: comments, leading VAR=value
    assignments and `$(...)` substitutions (as one placeholder word) handled."""
    line = re.sub(r"\$\([^)]*\)", "X", line)
    words = shlex.split(line, comments=True)
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words.pop(0)
    return words


def links(page: Path) -> list[str]:
    return _LINK.findall(page.read_text())


def anchors(page: Path) -> set[str]:
    """The ids GitHub gives the headings of `page`: lower case, punctuation but `-`
    and `_` dropped, spaces as `-`, repeats numbered."""
    text = _FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(text):
        plain = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
        plain = re.sub(r"[`*]|<[^>]+>", "", plain).strip().lower()
        slug = re.sub(r"[^\w\- ]", "", plain).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out
