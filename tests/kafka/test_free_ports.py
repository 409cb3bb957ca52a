"""Ports for a local broker's two listeners: never the same one twice."""

from __future__ import annotations

import socket

from delayservice.ports import free_ports


def test_ports_chosen_together_are_distinct_and_free() -> None:
    ports = free_ports(64)
    assert len(set(ports)) == len(ports)
    for port in ports[:4]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # released once chosen
