"""What every source hands to an agent: raw records, settled by the agent's outcome.

A source (Kafka, the in-memory broker; RabbitMQ to come) turns broker messages into
:class:`Record` values, runs them through :func:`streamapp.agent.run_batch` in order per
partition, and settles them by the result: it never settles a record the agent has not
settled (DELIVERED, FILTERED, or a confirmed park).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .errors import DecodeError
from .events import Event

Headers = Sequence[tuple[str, bytes]]


class Record(Protocol):
    """One message as the broker gave it. ``offset`` orders it within its partition.

    aiokafka's ConsumerRecord has this shape already, so Kafka records pass through
    without a copy; other sources build :class:`Message` values.
    """

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Headers: ...


@dataclass(frozen=True, slots=True)
class Message:
    """A plain :class:`Record`."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers


Decoder = Callable[[bytes | None, bytes | None, Headers], Event]
"""Turns a record into an Event or raises DecodeError (never anything else)."""

Parker = Callable[[Record, str], Awaitable[bool]]
"""Publishes a failed record with its reason; True once the broker confirmed it."""


class Source(Protocol):
    """A running source of one app's agents (one per transport per worker)."""

    async def start(self) -> None:
        """Connect, check what the app needs exists, begin delivering."""

    async def stop(self) -> None:
        """Finish batches in hand, flush tables, settle, disconnect."""


def park_headers(record: Record, reason: str, agent: str) -> list[tuple[str, bytes]]:
    """What a parked copy carries: the original headers, why, and where it came from."""
    return [
        *record.headers,
        ("streamapp-park-reason", reason.encode()),
        ("streamapp-agent", agent.encode()),
        ("streamapp-source", f"{record.topic}/{record.partition}/{record.offset}".encode()),
    ]


def decode_record(decode: Decoder, record: Record) -> Event | DecodeError:
    """The record's event, or the DecodeError that makes it NOT_DELIVERABLE."""
    try:
        return decode(record.key, record.value, record.headers)
    except DecodeError as exc:
        return exc
    except Exception as exc:  # a decoder bug must not break the source
        return DecodeError(f"decoder failed: {type(exc).__name__}: {exc}")
