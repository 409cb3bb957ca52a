"""Free loopback ports, for the supervisor's workers and the local broker."""

from __future__ import annotations

import contextlib
import socket


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports: each socket stays bound until all are chosen, or the
    kernel may hand the same port out twice (a broker whose two listeners shared one
    port failed to format its storage)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports
