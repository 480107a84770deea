"""The neutral vocabulary of the engine: a delivery, how it is decoded and parked.

A transport turns broker messages (a Kafka record, an AMQP delivery, a stored event)
into :class:`Delivery` values; the partition task runs them through the agent in order
and settles them by position. Nothing here knows a client library.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple, Protocol

from ..errors import DecodeError
from ..events import Event

Headers = Sequence[tuple[str, bytes]]

STORE_POSITION_HEADER = "streamapp-position"
"""Set by the forwarder: the event-store position of the event a message carries (ASCII
digits). A transport without a changelog resumes its replay after it."""


class Delivery(Protocol):
    """One message of one partition. ``position`` orders it within its partition: a
    Kafka offset, a RabbitMQ delivery sequence, an event-store position."""

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


class Message(NamedTuple):
    """A plain :class:`Delivery` (a tuple: cheap to build once per record)."""

    topic: str
    partition: int
    position: int
    key: bytes | None
    value: bytes | None
    headers: Headers


Decoder = Callable[[Delivery], Event]
"""Turns a delivery into an Event or raises DecodeError (never anything else)."""

Parker = Callable[[Delivery, str], Awaitable[bool]]
"""Publishes a failed delivery with its reason; True once the broker confirmed it."""


def park_headers(delivery: Delivery, reason: str, agent: str) -> list[tuple[str, bytes]]:
    """What a parked copy carries: the original headers, why, and where it came from."""
    origin = f"{delivery.topic}/{delivery.partition}/{delivery.position}"
    return [
        *delivery.headers,
        ("streamapp-park-reason", reason.encode()),
        ("streamapp-agent", agent.encode()),
        ("streamapp-source", origin.encode()),
    ]


def decode_delivery(decode: Decoder, delivery: Delivery) -> Event | DecodeError:
    """The delivery's event, or the DecodeError that makes it NOT_DELIVERABLE."""
    try:
        return decode(delivery)
    except DecodeError as exc:
        return exc
    except Exception as exc:  # a decoder bug must not break the source
        return DecodeError(f"decoder failed: {type(exc).__name__}: {exc}")
