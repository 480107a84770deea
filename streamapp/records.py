"""The two records of streamapp: a :class:`Delivery` comes in, a :class:`Message` goes out.

A transport turns what its broker hands out (a Kafka record, an AMQP delivery, a stored
event) into deliveries, ordered by ``position`` within a partition; whatever streamapp
publishes (derived events, parked and retried copies, forwarded events) is a message, to
a destination, with the partition when the publisher chose it. A leaf module: both are
plain bytes and names, and nothing here knows a client library.

Header and extension names streamapp and the CloudEvents bindings own.

An application must not send them: a ``ce_`` or ``cloudEvents_`` header is read back as
a CloudEvent attribute, a chain header (``x-reconsume``, ``x-retry-hop``, ...) steers
the retry chain and the relay, a ``streamapp-`` header is a parked copy's. They are
refused where the application sends them: every reserved name as an extension, in
:meth:`Event.create` and ``send(topic, event)`` (:class:`streamapp.agents.outputs.Send`); the
chain's and ``streamapp-`` headers in the sinks' ``publish`` (a message published there
carries its event's ``ce_`` / ``cloudEvents_`` headers, from the codec, by design).
Headers streamapp writes itself travel as :class:`Stamped`, which the sinks let through.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from .errors import ReservedNameError

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


PREFIXES = ("cloudevents_", "cloudevents:", "ce_", "streamapp-")
"""Reserved name prefixes, compared case-insensitively."""
CHAIN = frozenset(
    {
        "x-reconsume",
        "x-retry-hop",
        "x-deliver-at",
        "x-origin-topic",
        "x-retry-agent",
        "x-dlq-reason",
        "x-origin",
    }
)
"""The retry chain's headers (:mod:`streamapp.failures.retry_chain`)."""
_OWNERS = {
    "cloudevents_": "the CloudEvents AMQP binding's attribute headers",
    "cloudevents:": "the CloudEvents AMQP binding's attribute headers",
    "ce_": "the CloudEvents Kafka binding's attribute headers",
    "streamapp-": "streamapp's parking headers",
}


class Stamped(list[tuple[str, bytes]]):
    """Headers streamapp wrote itself (a park, a chain copy): the sinks' check of
    reserved names lets them through."""

    __slots__ = ()


def reserved(name: str, *, binding: bool = True) -> str | None:
    """Why ``name`` is reserved (None: free for the application); ``binding=False``
    leaves the CloudEvents bindings' prefixes out (a sink's headers)."""
    lower = name.lower()
    if lower in CHAIN:
        return "a retry-chain header"
    for prefix in PREFIXES if binding else ("streamapp-",):
        if lower.startswith(prefix):
            return f"prefix {prefix!r}: {_OWNERS[prefix]}"
    return None


def suggestion(name: str) -> str:
    """A free name for ``name``: lower case letters and digits, the reserved part gone
    (CloudEvents extension names are ``[a-z0-9]``)."""
    lower = name.lower()
    for prefix in PREFIXES:
        if lower.startswith(prefix):
            lower = lower[len(prefix) :]
            break
    plain = "".join(c for c in lower if c.isascii() and c.isalnum())
    return ("app" + plain) if plain else "appvalue"


def first_reserved(names: Iterable[str], *, binding: bool = True) -> tuple[str, str] | None:
    """The first reserved name among ``names`` and why, or None."""
    for name in names:
        why = reserved(name, binding=binding)
        if why is not None:
            return name, why
    return None


def refuse_extensions(names: Iterable[str], where: str) -> None:
    """ReservedNameError naming the first extension of ``names`` with a reserved name."""
    found = first_reserved(names)
    if found is not None:
        name, why = found
        raise ReservedNameError(
            f"{where}: extension {name!r} is reserved ({why}); give the extension a "
            f"plain name such as {suggestion(name)!r} (lower case letters and digits)"
        )


def refuse_headers(headers: Iterable[tuple[str, bytes]], where: str) -> None:
    """ReservedNameError naming the first chain or ``streamapp-`` header (none for
    :class:`Stamped` headers)."""
    if isinstance(headers, Stamped):
        return
    found = first_reserved((name for name, _ in headers), binding=False)
    if found is not None:
        name, why = found
        raise ReservedNameError(
            f"{where}: header {name!r} is reserved ({why}); put the value in the event "
            f"(its data, or an extension such as {suggestion(name)!r}) or give the header "
            "a name of your own"
        )
