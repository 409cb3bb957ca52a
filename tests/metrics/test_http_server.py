import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from delayservice.errors import ConfigError
from delayservice.metrics.http_server import MetricsServer
from delayservice.metrics.service_metrics import ServiceMetrics


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_metrics_health_and_readiness():
    registry = CollectorRegistry()
    metrics = ServiceMetrics(registry)
    metrics.forwarded.labels("5s").inc(3)
    state = {"ready": False}
    server = MetricsServer(
        registry,
        lambda: (state["ready"], "ready" if state["ready"] else "starting"),
        "127.0.0.1",
        0,
    )
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        status, body = _get(f"{base}/metrics")
        assert status == 200
        assert 'delayservice_forwarded_total{level="5s"} 3.0' in body
        assert _get(f"{base}/healthz") == (200, "ok\n")
        assert _get(f"{base}/readyz") == (503, "starting\n")
        state["ready"] = True
        assert _get(f"{base}/readyz") == (200, "ready\n")
        assert _get(f"{base}/nope")[0] == 404
    finally:
        server.stop()


def test_each_registry_is_separate():
    a, b = CollectorRegistry(), CollectorRegistry()
    ServiceMetrics(a).consumed.labels("1s").inc()
    ServiceMetrics(b)
    assert a.get_sample_value("delayservice_consumed_total", {"level": "1s"}) == 1
    assert b.get_sample_value("delayservice_consumed_total", {"level": "1s"}) is None


def test_a_port_in_use_is_a_config_error():
    first = MetricsServer(CollectorRegistry(), lambda: (True, ""), "127.0.0.1", 0)
    try:
        with pytest.raises(ConfigError, match="metrics_port"):
            MetricsServer(CollectorRegistry(), lambda: (True, ""), "127.0.0.1", first.port)
    finally:
        first.stop()
