"""The README is the front door: every link it and the docs hold must lead somewhere
(down to the heading a `#fragment` names), and every `delayservice` line they show must
parse as the command line would parse it: the exact words, arguments and options."""

from __future__ import annotations

import re

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from delayservice.cli.app import app
from delayservice.markers.level_ids import level_place
from delayservice.markers.precise_ids import named_place
from tests.docs.markdown import (
    PAGES,
    README,
    ROOT,
    anchors,
    blocks,
    command_words,
    links,
    shell_lines,
)

ID_ARGUMENT = re.compile(r"[0-9a-f]{32}(-[pf](0|[1-9][0-9]*))?")
"""A level id (32 hex digits) or an exact one (`-p<partition>`, `-f<partition>`)."""


def _relative_links(page):
    return [target for target in links(page) if not re.match(r"^[a-z]+:", target)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_to_its_file_and_heading(page):
    def leads_somewhere(target: str) -> bool:
        path, _, fragment = target.partition("#")
        linked = (page.parent / path) if path else page
        if not linked.exists():
            return False
        return not fragment or linked.suffix != ".md" or fragment in anchors(linked)

    broken = [target for target in _relative_links(page) if not leads_somewhere(target)]
    assert broken == [], f"{page.name} links to what does not exist"


def test_anchors_follow_githubs_rule():
    """Pinned to what GitHub renders for this project's own headings."""
    assert "replies-to-cancel-and-reschedule" in anchors(ROOT / "docs" / "precise-mode.md")
    assert "precise-mode-earlier-sittings" in anchors(ROOT / "docs" / "performance.md")
    assert "what-a-reschedule-promises" not in anchors(ROOT / "docs" / "precise-mode.md")


def test_the_readme_links_every_docs_page():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in _relative_links(README)}
    pages = set((ROOT / "docs").glob("*.md"))
    assert {p.resolve() for p in pages} - linked == set(), "docs pages the README never names"


def test_the_readme_stays_a_front_door():
    assert len(README.read_text().splitlines()) <= 260


def _shell_commands(pages=PAGES):
    return [
        (block, words)
        for page in pages
        for block in blocks(page)
        if block.language != "python"
        for words in map(command_words, shell_lines(block))
        if words
    ]


def test_every_script_the_readme_runs_exists_and_is_executable():
    scripts = [words[0] for _, words in _shell_commands([README]) if words[0].startswith("./")]
    assert scripts, "the README names no script"
    for script in scripts:
        path = ROOT / script
        assert path.is_file(), script
        assert path.stat().st_mode & 0o111, f"{script} is not executable"


CLI_LINES = [
    pytest.param(words[1:], id=f"{block.name} {' '.join(words)}")
    for block, words in _shell_commands()
    if words[0] == "delayservice"
]


def test_the_docs_show_cli_commands():
    assert len(CLI_LINES) >= 20


def _parse(args: list[str]) -> tuple[list[str], dict[str, object]]:
    """The command path and its parameters, as `delayservice ARGS` would get them: the
    real parser runs, each command's body is replaced by one that notes what it got."""
    seen: dict[str, object] = {}

    def rewire(command: object, path: list[str]) -> None:
        def noted(**params: object) -> None:
            seen.update(path=path, params=params)

        command.callback = noted  # type: ignore[attr-defined]
        for name, sub in getattr(command, "commands", {}).items():
            rewire(sub, [*path, name])

    root = get_command(app)  # a fresh command tree: the app itself is untouched
    rewire(root, [])
    root.main(list(args), prog_name="delayservice", standalone_mode=False)
    return seen["path"], seen["params"]  # type: ignore[return-value]


@pytest.mark.parametrize("args", CLI_LINES)
def test_every_delayservice_line_in_the_docs_parses(args):
    if "--help" in args or "--version" in args or not args:
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        return
    try:
        path, params = _parse(args)
    except Exception as exc:  # click's UsageError and its kin, as the CLI would print them
        reason = exc.format_message() if hasattr(exc, "format_message") else repr(exc)
        pytest.fail(f"`delayservice {' '.join(args)}`: {reason}")
    message_id = params.get("message_id")
    if path[0] in ("cancel", "reschedule"):
        assert isinstance(message_id, str)
        assert named_place(message_id) is not None or level_place(message_id) is not None, (
            f"{message_id} is neither an exact id (-p<N>) nor a level id (-l<N>p<N>)"
        )
    elif message_id is not None:
        assert ID_ARGUMENT.fullmatch(str(message_id)), f"{message_id} is not a message id"


def test_the_docs_say_what_each_callback_confirms():
    """on_delivery confirms the write to the delay topic, not the forward: an application
    that took it for delivery would be told so nowhere else."""
    rows = {
        line.split("|")[1].strip(): line.split("|")[2]
        for line in (ROOT / "docs" / "producer.md").read_text().splitlines()
        if line.startswith("| `")
    }
    delayed = rows["`on_delivery(err, msg)` of a delayed record"]
    assert "**on the delay topic**" in delayed
    assert "Not that it was forwarded" in delayed
    assert "the daemon's reply" in rows["`receipt.reply(timeout)`, or `wait=`"]
    assert "docs/producer.md" in README.read_text()
