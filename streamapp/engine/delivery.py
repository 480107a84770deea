"""What the engine does with a :class:`~streamapp.records.Delivery`: decode it, park it.

A transport turns broker messages (a Kafka record, an AMQP delivery, a stored event)
into deliveries (:mod:`streamapp.records`); the partition task runs them through the
agent in order and settles them by position. Nothing here knows a client library.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..errors import DecodeError
from ..events import Event
from ..records import Delivery, Stamped

STORE_POSITION_HEADER = "streamapp-position"
"""Set by the forwarder: the event-store position of the event a message carries (ASCII
digits). A transport without a changelog resumes its replay after it."""


Decoder = Callable[[Delivery], Event]
"""Turns a delivery into an Event or raises DecodeError (never anything else)."""

Parker = Callable[[Delivery, str], Awaitable[bool]]
"""Publishes a failed delivery with its reason; True once the broker confirmed it."""


def park_headers(delivery: Delivery, reason: str, agent: str) -> list[tuple[str, bytes]]:
    """What a parked copy carries: the original headers, why, and where it came from."""
    origin = f"{delivery.topic}/{delivery.partition}/{delivery.position}"
    return Stamped(
        [
            *delivery.headers,
            ("streamapp-park-reason", reason.encode()),
            ("streamapp-agent", agent.encode()),
            ("streamapp-source", origin.encode()),
        ]
    )


def decode_delivery(decode: Decoder, delivery: Delivery) -> Event | DecodeError:
    """The delivery's event, or the DecodeError that makes it NOT_DELIVERABLE."""
    try:
        return decode(delivery)
    except DecodeError as exc:
        return exc
    except Exception as exc:  # a decoder bug must not break the source
        return DecodeError(f"decoder failed: {type(exc).__name__}: {exc}")
