"""/metrics, /healthz and /readyz on one small threaded HTTP server.

`/healthz` answers while the process serves at all (liveness); `/readyz` answers 200
only while the daemon reaches the broker and every level runs, so an orchestrator or
`delayservice check` can tell a stuck instance from a healthy one.

The port is often reachable by more than the scraper, so no client may hold the server:
each connection gets a socket timeout and a whole-connection deadline (a client that
sends nothing, dribbles its request or reads slowly is dropped), and at most
`max_threads` connections are served at once; beyond that a new connection is answered
503 and closed at once instead of getting a thread of its own.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from delayservice.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_THREADS = 16
CONNECTION_THREAD_NAME = "metrics-http-conn"
_BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 5\r\nConnection: close\r\n\r\nbusy\n"
)


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


class _BoundedServer(ThreadingHTTPServer):
    """One thread per connection, but never more than `max_threads`, and no connection
    outlives its deadline: the serve loop shuts down overdue sockets between polls."""

    daemon_threads = True
    block_on_close = False
    # The default backlog of 5 drops SYNs under a burst of connections, which stalls
    # every client (the scraper too) in TCP retransmits for seconds before any refusal.
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        timeout_s: float,
        max_threads: int,
    ) -> None:
        super().__init__(address, handler)
        self._timeout_s = timeout_s
        self._slots = threading.BoundedSemaphore(max_threads)
        self._lock = threading.Lock()
        # Connections being served, with their deadlines; a socket leaves this map (under
        # the lock) before it is closed, so the watchdog never shuts down a reused fd.
        self._open: dict[socket.socket, float] = {}

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self._refuse(request)
            return
        with self._lock:
            self._open[request] = time.monotonic() + self._timeout_s
        try:
            threading.Thread(
                target=self.process_request_thread,
                args=(request, client_address),
                name=CONNECTION_THREAD_NAME,
                daemon=True,
            ).start()
        except RuntimeError:  # cannot start a thread: refuse rather than fail the loop
            self._forget(request)
            self._slots.release()
            self._refuse(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # one bad client must not stop the server
            self.handle_error(request, client_address)
        finally:
            self._forget(request)
            self.shutdown_request(request)
            self._slots.release()

    def _refuse(self, request: socket.socket) -> None:
        """Best effort 503 without ever blocking the serve loop, then close."""
        with contextlib.suppress(OSError):
            request.setblocking(False)
            request.send(_BUSY)
        self.shutdown_request(request)

    def _forget(self, request: socket.socket) -> None:
        with self._lock:
            self._open.pop(request, None)

    def service_actions(self) -> None:
        """Called by serve_forever between polls: end connections past their deadline."""
        now = time.monotonic()
        with self._lock:
            for sock, deadline in self._open.items():
                if deadline <= now:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)  # wakes the handler's blocked read

    def drop_all(self) -> None:
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that vanished or was cut off is routine, not a traceback on stderr."""
        log.debug("metrics client %s: connection ended: %r", client_address, sys.exc_info()[1])


class MetricsServer:
    def __init__(
        self,
        registry: CollectorRegistry,
        readiness: Callable[[], tuple[bool, str]],
        host: str,
        port: int,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_threads: int = DEFAULT_MAX_THREADS,
    ) -> None:
        handler = type(
            "Handler",
            (_Handler,),
            {
                "registry": registry,
                "readiness": staticmethod(readiness),
                "timeout": timeout_s,  # socket timeout of every read and write
            },
        )
        try:
            self._server = _BoundedServer((host, port), handler, timeout_s, max_threads)
        except OSError as exc:
            raise ConfigError(
                "metrics_port", f"cannot listen on {host}:{port}: {exc.strerror}"
            ) from exc
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": min(0.5, timeout_s / 4)},
            name="metrics-http",
            daemon=True,
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever, which may never have run
            self._server.shutdown()
        self._server.drop_all()
        self._server.server_close()
