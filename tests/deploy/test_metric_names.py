"""Every metric name the dashboard and the alert rules use is one the daemon exports."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from delayservice.metrics.service_metrics import ServiceMetrics

# The sample names each metric type produces in the exposition format.
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
}


def exported_names() -> dict[str, str]:
    """Sample name -> metric family, for a fresh ServiceMetrics on its own registry."""
    registry = CollectorRegistry()
    ServiceMetrics(registry)
    return {
        family.name + suffix: family.name
        for family in registry.collect()
        for suffix in _SUFFIXES[family.type]
    }


def test_the_promql_reader_finds_metrics_and_nothing_else(deploy):
    expr = (
        'histogram_quantile(0.99, sum by (le, level) (rate(a_bucket{level=~"$level"}'
        "[$__rate_interval]))) / on (instance, level) group_left (topic) b offset 5m"
        " > bool 2 unless count without (x) (c) and max(d) or topk(3, e)"
    )
    assert deploy.promql_metric_names(expr) == {"a_bucket", "b", "c", "d", "e"}
    assert deploy.template_metric_names('label_values(m{instance=~"$instance"}, level)') == {"m"}
    assert deploy.template_metric_names("label_values(level)") == set()


def test_every_metric_in_the_dashboard_and_rules_is_exported(deploy):
    exported = exported_names()
    used = deploy.used_metric_names()
    missing = {
        name: sorted(where)
        for name, where in used.items()
        if name not in exported and name not in deploy.synthetic
    }
    assert not missing, f"used but not exported by ServiceMetrics: {missing}"
    assert {n for n in used if n.startswith("delayservice_")}, "found no metric names at all"


def test_every_exported_metric_is_on_the_dashboard(deploy):
    exported = exported_names()
    exprs = [expr for _title, expr in deploy.dashboard_exprs()]
    shown = {name for expr in exprs for name in deploy.promql_metric_names(expr)}
    on_dashboard = {exported[name] for name in shown if name in exported}
    assert set(exported.values()) - on_dashboard == set(), "exported metrics with no panel"


def test_histograms_are_queried_through_their_series_not_their_family_name(deploy):
    histograms = {family for name, family in exported_names().items() if name.endswith("_bucket")}
    assert not histograms & set(deploy.used_metric_names()), "query _bucket/_sum/_count"
