"""The few client calls the level worker makes, as protocols.

The consumer loop and the forwarder are typed against these rather than against
confluent-kafka's classes, so unit tests can drive every path (revoke, seek-back,
retry, dead-letter, failed commits, stop) with small fakes, and the real clients
satisfy them unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol, overload

from confluent_kafka import Message, TopicPartition

RebalanceCallback = Callable[[Any, list[TopicPartition]], None]
DeliveryCallback = Callable[[Any, Message], None]


class ConsumerClient(Protocol):
    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback = ...,
        on_revoke: RebalanceCallback = ...,
        on_lost: RebalanceCallback = ...,
    ) -> None: ...

    def assign(self, partitions: list[TopicPartition]) -> None: ...

    def incremental_assign(self, partitions: list[TopicPartition]) -> None: ...

    def consume(self, num_messages: int = ..., timeout: float = ...) -> list[Message]: ...

    def pause(self, partitions: list[TopicPartition]) -> None: ...

    def resume(self, partitions: list[TopicPartition]) -> None: ...

    def seek(self, partition: TopicPartition) -> None: ...

    @overload
    def commit(self, *, offsets: list[TopicPartition], asynchronous: Literal[True]) -> None: ...

    @overload
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[False]
    ) -> list[TopicPartition]: ...

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]: ...

    def committed(
        self, partitions: list[TopicPartition], timeout: float = ...
    ) -> list[TopicPartition]: ...

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = ..., cached: bool = ...
    ) -> tuple[int, int]: ...

    def list_topics(self, topic: str | None = ..., timeout: float = ...) -> Any: ...

    def consumer_group_metadata(self) -> Any: ...

    def close(self) -> None: ...


class ProducerClient(Protocol):
    def produce(
        self,
        topic: str,
        value: bytes | None = ...,
        key: bytes | None = ...,
        partition: int = ...,
        callback: DeliveryCallback | None = ...,
        on_delivery: DeliveryCallback | None = ...,
        timestamp: int = ...,
        headers: list[tuple[str, str | bytes | None]] | None = ...,
    ) -> None:
        """confluent-kafka's order: the forwarder's fast paths pass every argument by
        position (`forward.sender.ANY_PARTITION`)."""

    def poll(self, timeout: float = ...) -> int: ...

    def flush(self, timeout: float = ...) -> int: ...

    def list_topics(self, topic: str | None = ..., timeout: float = ...) -> Any: ...
