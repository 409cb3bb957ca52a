import select
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from delayservice.errors import ConfigError
from delayservice.metrics.http_server import CONNECTION_THREAD_NAME, MetricsServer
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


# -- slow and idle clients ---------------------------------------------------------
# A short timeout keeps these tests quick; the production default is a few seconds.
TIMEOUT_S = 1.5
BOUND = 16


def _until(condition, timeout: float, what: str) -> float:
    """Poll `condition` until true; returns the seconds it took, fails after `timeout`."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)
    return time.monotonic() - started


def _handler_threads() -> int:
    return sum(t.name == CONNECTION_THREAD_NAME for t in threading.enumerate())


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server has ended the connection (EOF or reset); drains what it sent."""
    while select.select([sock], [], [], 0)[0]:
        try:
            if not sock.recv(65536):
                return True
        except OSError:
            return True
    return False


def _scrape(port: int) -> int | None:
    """Status of one GET /metrics, or None when the connection was refused or cut."""
    try:
        return _get(f"http://127.0.0.1:{port}/metrics")[0]
    except OSError:
        return None


@pytest.fixture
def bounded_server():
    registry = CollectorRegistry()
    ServiceMetrics(registry).forwarded.labels("5s").inc()
    server = MetricsServer(
        registry, lambda: (True, "ready"), "127.0.0.1", 0, timeout_s=TIMEOUT_S, max_threads=BOUND
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_idle_connections_beyond_the_bound_get_no_thread_and_scrapes_recover(bounded_server):
    port = bounded_server.port
    before = set(threading.enumerate())
    flood = 3 * BOUND
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(flood)]
    opened = time.monotonic()
    try:
        closed: set[socket.socket] = set()

        def refused_all_but_bound() -> bool:
            closed.update(c for c in conns if c not in closed and _closed_by_server(c))
            return len(closed) >= flood - BOUND

        took = _until(refused_all_but_bound, 10, "connections beyond the bound to be refused")
        # Refused at once, not by the timeout: the server gave them no thread to wait in.
        assert took < TIMEOUT_S / 2, f"refusals took {took:.2f}s"
        assert _handler_threads() == BOUND
        # No other thread of the server's: a count of every thread of the process also
        # counted a thread some earlier test's client started meanwhile (21 > 20, in CI).
        started = [t.name for t in set(threading.enumerate()) - before]
        assert [n for n in started if n.startswith("metrics-http")] == [
            CONNECTION_THREAD_NAME
        ] * BOUND
        held = [c for c in conns if c not in closed]
        assert len(held) == BOUND

        # Every slot is held by an idle client, so a scrape is refused at once (503, or the
        # connection is cut before the answer is read), never left hanging.
        asked = time.monotonic()
        assert _scrape(port) in (503, None)
        assert time.monotonic() - asked < 1.0

        # (c) the server closes the idle connections itself, once their timeout has passed.
        first_drop: list[float] = []

        def all_dropped() -> bool:
            gone = [c for c in held if c in closed or _closed_by_server(c)]
            closed.update(gone)
            if gone and not first_drop:
                first_drop.append(time.monotonic() - opened)
            return len(gone) == len(held)

        _until(all_dropped, TIMEOUT_S + 3, "the server to drop the idle connections")
        assert first_drop[0] >= TIMEOUT_S * 0.9, f"dropped after {first_drop[0]:.2f}s"

        # (a) and a normal scrape succeeds again, within the timeout window of the flood.
        assert _scrape(port) == 200
        assert time.monotonic() - opened < TIMEOUT_S + 3
        _until(lambda: _handler_threads() == 0, 5, "the handler threads to finish")
    finally:
        for conn in conns:
            conn.close()


def test_a_client_dribbling_its_request_is_cut_off_at_the_deadline(bounded_server):
    """One header byte every TIMEOUT_S/5 never trips a per-read timeout; the
    whole-connection deadline must still end it."""
    sock = socket.create_connection(("127.0.0.1", bounded_server.port))
    try:
        sock.sendall(b"GET /metrics HTTP/1.0\r\nX-Slow: ")
        started = time.monotonic()
        cut_after = None
        while time.monotonic() - started < TIMEOUT_S + 5:
            # select() both paces the client and notices the server closing.
            if select.select([sock], [], [], TIMEOUT_S / 5)[0] and _closed_by_server(sock):
                cut_after = time.monotonic() - started
                break
            try:
                sock.sendall(b"x")
            except OSError:
                cut_after = time.monotonic() - started
                break
        assert cut_after is not None, "the server kept serving a dribbling client"
        assert TIMEOUT_S * 0.9 <= cut_after <= TIMEOUT_S + 2, f"cut after {cut_after:.2f}s"
    finally:
        sock.close()
    _until(lambda: _handler_threads() == 0, 5, "the handler thread to finish")
    assert _scrape(bounded_server.port) == 200


class _Huge(Collector):
    """One metric whose help text dwarfs any socket buffer (32 MiB), built cheaply."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("huge", "x" * (32 * 1024 * 1024), value=1)


def test_a_client_that_never_reads_its_answer_is_dropped():
    """A response far larger than the socket buffers blocks the handler's write until the
    timeout; the thread must come back and the answer stay cut."""
    registry = CollectorRegistry()
    registry.register(_Huge())
    full = len(generate_latest(registry))
    server = MetricsServer(
        registry, lambda: (True, ""), "127.0.0.1", 0, timeout_s=TIMEOUT_S, max_threads=BOUND
    )
    server.start()
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sent = time.monotonic()
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        _until(lambda: _handler_threads() == 1, 5, "the request to be taken")
        _until(lambda: _handler_threads() == 0, TIMEOUT_S + 5, "the writer to give up")
        took = time.monotonic() - sent
        assert took >= TIMEOUT_S * 0.9, f"the handler ended after only {took:.2f}s"
        received = 0
        sock.settimeout(5)
        try:
            while chunk := sock.recv(65536):
                received += len(chunk)
        except OSError:
            pass  # a reset is as good as an end here
        assert received < full, f"got all {full} bytes: the write never blocked"
        assert _scrape(server.port) == 200
    finally:
        sock.close()
        server.stop()
