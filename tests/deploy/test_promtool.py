"""promtool accepts the Prometheus config and the rules, and the rule unit tests pass."""

from __future__ import annotations

import subprocess

import pytest

pytestmark = pytest.mark.prometheus


def promtool(deploy, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [deploy.need_tool("promtool"), *args],
        cwd=deploy.prometheus_dir, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_prometheus_config_is_valid(deploy):
    result = promtool(deploy, "check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout + result.stderr


def test_alert_rules_are_valid(deploy):
    result = promtool(deploy, "check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rule_unit_tests_pass(deploy):
    result = promtool(deploy, "test", "rules", "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_exercised_by_a_unit_test_that_fires_it(deploy):
    defined = {rule["alert"] for rule in deploy.alert_rules() if "alert" in rule}
    fired = {
        case["alertname"]
        for test in deploy.load_yaml(deploy.prometheus_dir / "alerts_test.yml")["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert defined - fired == set(), "alerts no unit test fires"
    assert fired - defined == set(), "unit tests of alerts that do not exist"


def test_every_alert_has_a_severity_a_summary_and_a_runbook_entry(deploy):
    runbook = (deploy.root / "docs" / "operations.md").read_text()
    for rule in deploy.alert_rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"], name
        assert rule["annotations"]["description"], name
        assert f"`{name}`" in runbook, f"the operations docs do not say what to do on {name}"
