"""Which partitions of a topic the brokers still host, asked with DescribeLogDirs.

A KRaft broker drops a deleted topic from its metadata cache before its replica
manager stops the partitions (`BrokerMetadataPublisher.onMetadataUpdate` sets the new
image, then applies the topics delta). In between, `list_topics` says the topic is
gone while produce requests to it are still appended and acknowledged, and those
records vanish with the topic. A test that counts what reached a deleted topic must
therefore wait until no broker hosts a log of it any more; the replica manager removes
every partition from its map before it hands their logs to the deleter, so an empty
answer here means every produce to the old topic is refused.

confluent-kafka's admin client has no DescribeLogDirs, so this speaks version 1 of the
request (not flexible; served by every broker since Kafka 1.1) on a plain socket.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable
from typing import Any

from confluent_kafka.admin import AdminClient

from delayservice.errors import DelayServiceError

_API_KEY = 35
_API_VERSION = 1
_CLIENT_ID = b"delayservice-tests-log-dirs"


def deleted_everywhere(admin: AdminClient, topic: str) -> bool:
    """True once the metadata no longer names `topic` and no broker hosts a log of it:
    from then on every produce to the old topic is refused."""
    metadata = admin.list_topics(timeout=10)
    if topic in metadata.topics:
        return False
    return not hosted_partitions(brokers_of(metadata), topic)


def brokers_of(metadata: Any) -> list[tuple[str, int]]:
    """(host, port) of every broker `list_topics` named."""
    return [(broker.host, broker.port) for broker in metadata.brokers.values()]


def hosted_partitions(brokers: Iterable[tuple[str, int]], topic: str) -> set[int]:
    """The partitions of `topic` that any of `brokers` holds a log for (the live ones,
    not logs already renamed for deletion)."""
    hosted: set[int] = set()
    for host, port in brokers:
        hosted |= _ask(host, port, topic)
    return hosted


def _ask(host: str, port: int, topic: str) -> set[int]:
    header = struct.pack(">hhih", _API_KEY, _API_VERSION, 1, len(_CLIENT_ID)) + _CLIENT_ID
    body = struct.pack(">i", -1)  # null: every topic the broker hosts
    request = header + body
    with socket.create_connection((host, port), timeout=15) as conn:
        conn.sendall(struct.pack(">i", len(request)) + request)
        size = struct.unpack(">i", _read(conn, 4))[0]
        reply = _Reply(_read(conn, size))
    if reply.int32() != 1:
        raise DelayServiceError(f"DescribeLogDirs on {host}:{port}: a reply to another request")
    reply.int32()  # throttle_time_ms
    hosted: set[int] = set()
    for _ in range(reply.int32()):
        error, log_dir = reply.int16(), reply.string()
        if error:
            raise DelayServiceError(
                f"DescribeLogDirs on {host}:{port} refused {log_dir}", code=error
            )
        for _ in range(reply.int32()):
            name = reply.string()
            for _ in range(reply.int32()):
                partition = reply.int32()
                reply.skip(8 + 8 + 1)  # size, offset lag, is_future
                if name == topic:
                    hosted.add(partition)
    return hosted


def _read(conn: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = conn.recv(size - len(chunks))
        if not chunk:
            raise DelayServiceError("DescribeLogDirs: the broker closed the connection")
        chunks += chunk
    return bytes(chunks)


class _Reply:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._at = 0

    def _take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self._data, self._at)
        self._at += struct.calcsize(fmt)
        return int(value)

    def int16(self) -> int:
        return self._take(">h")

    def int32(self) -> int:
        return self._take(">i")

    def skip(self, size: int) -> None:
        self._at += size

    def string(self) -> str:
        size = self.int16()
        text = self._data[self._at : self._at + size].decode()
        self._at += size
        return text
