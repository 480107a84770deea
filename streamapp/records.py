"""The two records of streamapp: a :class:`Delivery` comes in, a :class:`Message` goes out.

A transport turns what its broker hands out (a Kafka record, an AMQP delivery, a stored
event) into deliveries, ordered by ``position`` within a partition; whatever streamapp
publishes (derived events, parked and retried copies, forwarded events) is a message, to
a destination, with the partition when the publisher chose it. A leaf module: both are
plain bytes and names, and nothing here knows a client library.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

Headers = Sequence[tuple[str, bytes]]


class Delivery(Protocol):
    """One incoming record of one partition. ``position`` orders it within its partition:
    a Kafka offset, a RabbitMQ delivery sequence, an event-store position."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def position(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Headers: ...


class DeliveryRecord(NamedTuple):
    """A plain :class:`Delivery` (a tuple: cheap to build once per record)."""

    topic: str
    partition: int
    position: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int | None = None
    """When the record entered its topic, where the broker says (Kafka: the record's
    timestamp, in ms since the epoch, as aiokafka decodes it: the producer's send time,
    or the broker's append time on a topic with ``LogAppendTime``). Read only when a
    lag in seconds is asked for (:mod:`streamapp.engine.stalled`)."""


@dataclass(frozen=True, slots=True)
class Message:
    """One outgoing record to publish: destination, key, body and headers as bytes;
    ``partition`` when the publisher chose it (None: the sink's partitioner, over the key)."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    headers: Headers = ()
    partition: int | None = None


@dataclass(frozen=True, slots=True)
class Receipt:
    """Where the broker put a message (partition and offset where the broker has them)."""

    topic: str
    partition: int | None = None
    offset: int | None = None
