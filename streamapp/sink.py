"""The broker-facing side of publishing, as small as a transport needs: start, stop, publish.

Kafka implements it today (:class:`streamapp.kafka.sink.KafkaSink`); a RabbitMQ sink plugs
in the same way. A publish returns only once the broker confirmed it, else raises
:class:`streamapp.errors.PublishError` (outcome unknown: publish again).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Message:
    """One record to publish: destination, key, body and headers as bytes; ``partition``
    when the publisher chose it (None: the sink's partitioner, over the key)."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    headers: Sequence[tuple[str, bytes]] = ()
    partition: int | None = None


@dataclass(frozen=True, slots=True)
class Receipt:
    """Where the broker put a message (partition and offset where the broker has them)."""

    topic: str
    partition: int | None = None
    offset: int | None = None


class Sink(Protocol):
    """A confirmed publisher."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def publish(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
    ) -> None:
        """Publish one message and wait for the broker's confirmation."""
        ...

    async def publish_many(self, messages: Sequence[Message]) -> list[Receipt]:
        """Publish all, many in flight at once, in order per key; return once every one
        is confirmed (receipts in the order of ``messages``)."""
        ...
