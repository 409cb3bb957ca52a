"""The package's layout rules (docs/layout.md), read from the code's own imports: the
two modes stand side by side over the marker protocol and the forward path, and what
the daemon imports holds no test support."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "delayservice"


def _imports(path: Path) -> set[str]:
    """Every `delayservice...` module a file imports, at any depth (TYPE_CHECKING too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] == "delayservice"}


def _room(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).with_suffix("").as_posix().replace("/", ".")


def _arrows(folder: str) -> list[tuple[str, str]]:
    return [
        (_room(path), name)
        for path in sorted((PACKAGE / folder).rglob("*.py"))
        for name in sorted(_imports(path))
    ]


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("level", ("delayservice.precise",)),
        ("precise", ("delayservice.level",)),
        ("markers", ("delayservice.level", "delayservice.precise", "delayservice.forward")),
        ("forward", ("delayservice.level", "delayservice.precise")),
    ],
)
def test_the_modes_stand_side_by_side_over_the_markers_and_the_forward_path(
    folder: str, forbidden: tuple[str, ...]
) -> None:
    wrong = [
        f"{room} imports {name}"
        for room, name in _arrows(folder)
        if any(_under(name, package) for package in forbidden)
    ]
    assert not wrong, "\n".join(wrong)


P = "delayservice.precise."


@pytest.mark.parametrize(
    ("room", "forbidden"),
    [
        ("precise/storage", (P + "wheel", P + "intake", P + "delivery", P + "precise_worker")),
        ("precise/wheel", (P + "intake", P + "delivery", P + "precise_worker")),
        ("precise/intake", (P + "delivery", P + "precise_worker")),
        ("precise/delivery", (P + "intake", P + "precise_worker")),
    ],
)
def test_precise_mode_s_rooms_stand_on_their_floors(room: str, forbidden: tuple[str, ...]) -> None:
    """Storage below all; the wheel above it; intake and delivery side by side above
    the wheel; precise_worker wires them."""
    wrong = [
        f"{name_of} imports {name}"
        for name_of, name in _arrows(room)
        if any(_under(name, package) for package in forbidden)
    ]
    assert not wrong, "\n".join(wrong)


def _test_timer(name: str) -> bool:
    return _under(name, "delayservice.timers") and not _under(name, "delayservice.timers.base")


def test_the_package_imports_no_test_support() -> None:
    """`delayservice.testing` (the local broker) serves the tests, the demo and the
    benchmarks; the timers library its benchmark. The daemon imports neither (its clock
    type is `delayservice.clock`)."""
    wrong = [
        f"{room} imports {name}"
        for room, name in _arrows(".")
        if not room.startswith(("delayservice.testing.", "delayservice.timers."))
        and (_under(name, "delayservice.testing") or _under(name, "delayservice.timers"))
    ]
    assert not wrong, "\n".join(wrong)


def test_the_rules_see_a_forbidden_import(tmp_path: Path) -> None:
    """The reader above finds imports at any depth, so the rules can fail."""
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from delayservice.precise.wheel.wheel import Wheel\n"
        "def f():\n"
        "    import delayservice.testing.local_broker\n"
    )
    assert {"delayservice.precise.wheel.wheel", "delayservice.testing.local_broker"} <= _imports(
        source
    )


def _route_calls(source: str) -> set[str]:
    """The names a module calls on `self.route` (the mode's route it holds)."""
    return {
        node.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "route"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "self"
    }


def test_the_shared_sender_never_calls_its_mode_back() -> None:
    """A record's path runs down from the mode's route into the sender's steps: the
    sender hands a run to the route and asks it about the work between runs, nothing
    about a record (`forward/send_route.py`)."""
    called = _route_calls((PACKAGE / "forward" / "sender.py").read_text())
    assert called == {"send_run", "waiting", "serve"}
    assert _route_calls("def f(self):\n    self.route.envelope(r)\n") == {"envelope"}
