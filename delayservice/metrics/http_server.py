"""/metrics, /healthz and /readyz on one small threaded HTTP server.

`/healthz` answers while the process serves at all (liveness); `/readyz` answers 200
only while the daemon reaches the broker and every level runs, so an orchestrator or
`delayservice check` can tell a stuck instance from a healthy one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from delayservice.errors import ConfigError


class _Handler(BaseHTTPRequestHandler):
    registry: CollectorRegistry
    readiness: Callable[[], tuple[bool, str]]

    def do_GET(self) -> None:
        if self.path.startswith("/metrics"):
            self._send(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        elif self.path == "/healthz":
            self._send(200, b"ok\n")
        elif self.path == "/readyz":
            ok, why = type(self).readiness()
            self._send(200 if ok else 503, (why + "\n").encode())
        else:
            self._send(404, b"not found\n")

    def _send(self, status: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Scrapes every few seconds would drown the daemon's own log."""


class MetricsServer:
    def __init__(
        self,
        registry: CollectorRegistry,
        readiness: Callable[[], tuple[bool, str]],
        host: str,
        port: int,
    ) -> None:
        handler = type(
            "Handler", (_Handler,), {"registry": registry, "readiness": staticmethod(readiness)}
        )
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise ConfigError(
                "metrics_port", f"cannot listen on {host}:{port}: {exc.strerror}"
            ) from exc
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics-http", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever, which may never have run
            self._server.shutdown()
        self._server.server_close()
