"""Every name the README and docs/ tell a user to import, run or install exists: each
`from delayservice… import …` imports, each error an application page names can be
imported from `delayservice`, each script a page runs is there and parses, and each
`pip install` (in a page or in a message the package prints) installs something that
can be installed from a checkout, with an extra that pyproject.toml defines. The
`delayservice …` command lines are parsed by test_readme."""

from __future__ import annotations

import ast
import builtins
import importlib
import re
import tomllib

import confluent_kafka
import pytest

import delayservice
from tests.docs.markdown import PAGES, README, ROOT

APPLICATION_PAGES = [
    README,
    *(
        ROOT / "docs" / name
        for name in ("producer.md", "cancel-and-reschedule.md", "precise-mode.md")
    ),
]
"""The pages an application developer reads: what they name, they will import."""

_IMPORT = re.compile(r"^\s*from (delayservice[\w.]*) import ([\w, ()]+)", re.M)
_ERROR_NAME = re.compile(r"`([A-Z][A-Za-z]+Error)`")
_SCRIPT = re.compile(r"python ((?:benchmarks|scripts)/[\w/]+\.py)")
_PIP = re.compile(r"pip install\s+(?:-\S+\s+)*(['\"]?)([^\s'\"#`]+)\1")


def _texts() -> list[tuple[str, str]]:
    return [(str(page.relative_to(ROOT)), page.read_text()) for page in PAGES]


def _imports() -> list[tuple[str, str, str]]:
    return [
        (where, match.group(1), name)
        for where, text in _texts()
        for match in _IMPORT.finditer(text)
        for name in re.split(r"[\s,()]+", match.group(2))
        if name
    ]


def _package_messages() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "delayservice").rglob("*.py"))


def test_the_pages_import_something():
    assert len(_imports()) >= 5


@pytest.mark.parametrize(("where", "module", "name"), _imports(), ids=str)
def test_every_import_a_page_shows_works(where, module, name):
    assert hasattr(importlib.import_module(module), name), f"{where}: from {module} import {name}"


def _named_errors() -> list[tuple[str, str]]:
    found = set()
    for page in APPLICATION_PAGES:
        for name in _ERROR_NAME.findall(page.read_text()):
            if not hasattr(builtins, name) and not hasattr(confluent_kafka, name):
                found.add((page.name, name))
    return sorted(found)


@pytest.mark.parametrize(("page", "name"), _named_errors(), ids=str)
def test_every_error_an_application_page_names_imports_from_the_package(page, name):
    assert name in delayservice.__all__, f"{page} names {name}: from delayservice import {name}"
    assert getattr(delayservice, name)


def test_the_package_exports_what_it_lists():
    for name in delayservice.__all__:
        assert getattr(delayservice, name) is not None


def _scripts() -> list[str]:
    return sorted({s for _where, text in _texts() for s in _SCRIPT.findall(text)})


@pytest.mark.parametrize("script", _scripts())
def test_every_script_a_page_runs_is_there_and_parses(script):
    path = ROOT / script
    assert path.is_file(), f"{script} is named in the docs"
    ast.parse(path.read_text(), script)


def _installs() -> list[tuple[str, str]]:
    found = [(where, m.group(2)) for where, text in _texts() for m in _PIP.finditer(text)]
    found += [("delayservice/", m.group(2)) for m in _PIP.finditer(_package_messages())]
    return sorted(set(found))


EXTRAS = set(
    tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
)
INSTALLABLE = re.compile(r"(\.|dist/delayservice-[^\[]*\.whl|build|[\w.-]+==[\w.]+)(\[(\w+)\])?")
"""A checkout (`.`), a wheel built from it, or a tool; never the bare name
`delayservice`, which is not published on an index."""


@pytest.mark.parametrize(("where", "target"), _installs(), ids=str)
def test_every_install_a_page_or_message_names_works_from_a_checkout(where, target):
    match = INSTALLABLE.fullmatch(target)
    assert match is not None, f"{where}: pip install {target} (delayservice is not published)"
    extra = match.group(3)
    assert extra is None or extra in EXTRAS, f"{where}: no [{extra}] extra in pyproject.toml"
