"""Parked and dead-lettered records sent back to their origin topic (``streamapp parked
replay``, ``streamapp dlq replay``).

A leaf module (records, headers and the chain's names only): each transport reads its
parking or dead-letter destination as :class:`Held` records (:class:`HeldReader`); the
command line drives :func:`replay` over one with the app's sink. What goes back is the
record as its producer sent it: the same key and value (the CloudEvent intact), the
business and CloudEvent headers, without the retry chain's headers
(:data:`streamapp.failures.retry_chain.CHAIN`: a record that kept ``x-reconsume`` would count on
from its old failures) and without streamapp's own ``streamapp-`` headers (the park
reason, agent and source, the forwarder's store position), but for
:data:`REPLAYED`, naming where it was held, and a held stream's marks. The origin is the
dead-letter copy's ``x-origin-topic``, else the topic of a parked copy's
``streamapp-source`` (``topic/partition/position``).

A record counts as sent once the sink confirmed it; the first one that is not confirmed
stops the run (:class:`~streamapp.errors.ReplayError`, naming it and how many went
before it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from ..errors import ReplayError
from ..records import CHAIN, Delivery, Headers, Message, Stamped

ORIGIN_TOPIC = "x-origin-topic"
"""The dead-letter copy's origin (:data:`streamapp.failures.retry_chain.ORIGIN_TOPIC`)."""
PARK_SOURCE = "streamapp-source"
"""A parked copy's ``topic/partition/position`` (:func:`streamapp.engine.delivery.park_headers`)."""
PARK_AGENT = "streamapp-agent"
"""The agent that parked the copy."""
REPLAYED = "streamapp-replayed"
"""Where a record sent back was held (:attr:`Held.where`, e.g. ``orders.parked/3/17`` or
``parked row 12``): set on what a replay sends, so that an agent whose stream-version
guard skips it although the table has not applied it can say so
(:func:`streamapp.engine.settle.settle_failed`)."""
HELD_STREAM = "streamapp-held-stream"
"""On a parked copy of a held stream (``Park(destination, hold="stream")``): the stream
id. Kept on what a replay sends back, so the lane that holds the stream takes the record
as part of its release (:mod:`streamapp.engine.hold`)."""
HELD_PLACE = "streamapp-held-place"
"""On a parked copy of a held stream: its place in the hold (1: the event that failed)."""
HELD_SKIP = "streamapp-held-skip"
"""On a held event sent back by ``streamapp parked skip``: skip it for good (the reason)."""
HELD_MARKS = (HELD_STREAM, HELD_PLACE, HELD_SKIP)
"""streamapp's own headers a record sent back keeps: a held stream's marks."""
OWN_PREFIX = "streamapp-"


@dataclass(frozen=True, slots=True)
class Held:
    """One record a parking or dead-letter destination holds, as read back."""

    where: str
    """Where it is: ``topic/partition/offset`` (Kafka), ``queue Q, message N`` (RabbitMQ),
    ``parked row N`` (the event store)."""
    key: bytes | None
    value: bytes | None
    headers: Headers
    settle: Callable[[], Awaitable[None]] | None = field(default=None, compare=False)
    """Called once the record is confirmed at its origin (RabbitMQ: the ack)."""


class HeldReader(Protocol):
    """A parking or dead-letter destination as one run reads it: from its start (or the
    run's ``--from``) to its end as of :meth:`start` (or ``--until``), each record once."""

    async def start(self) -> None:
        """Connect and fix the run's bounds; ReplayError naming an option that does not
        apply (an offset beyond the end, offsets where there are none)."""

    def read(self) -> AsyncIterator[Held]:
        """The records within the bounds, in order (per partition or queue)."""

    async def stop(self) -> None:
        """Disconnect; what was read and not settled stays where it was."""


def origin_topic(headers: Headers) -> str | None:
    """The topic the record came from: ``x-origin-topic``, else the topic part of
    ``streamapp-source`` (None: neither)."""
    source: bytes | None = None
    for name, value in headers:
        if name == ORIGIN_TOPIC:
            return value.decode(errors="replace")
        if name == PARK_SOURCE:
            source = value
    if source is None:
        return None
    topic = source.decode(errors="replace").rsplit("/", 2)[0]
    return topic or None


def parked_source(headers: Headers) -> tuple[str, int] | None:
    """The topic and position a parked copy came from (``streamapp-source``:
    ``topic/partition/position``; None: not parked by streamapp)."""
    raw = next((v for n, v in reversed(list(headers)) if n == PARK_SOURCE), None)
    if raw is None:
        return None
    rest, _, position = raw.decode(errors="replace").rpartition("/")
    topic = rest.rpartition("/")[0]
    try:
        return (topic, int(position)) if topic else None
    except ValueError:
        return None


def stripped(headers: Headers) -> list[tuple[str, bytes]]:
    """``headers`` without the chain's and streamapp's own (``streamapp-`` prefix), but
    for a held stream's marks (:data:`HELD_MARKS`)."""
    return [
        (n, v)
        for n, v in headers
        if n.lower() not in CHAIN
        and (not n.lower().startswith(OWN_PREFIX) or n.lower() in HELD_MARKS)
    ]


def back_to_origin(record: Held, topics: frozenset[str]) -> Message:
    """The message that sends ``record`` back to its origin topic (one of ``topics``,
    the app's sources; the partition is the key's). ReplayError when it has no origin
    or an origin the app does not read."""
    origin = origin_topic(record.headers)
    if origin is None:
        raise ReplayError(
            f"record {record.where} has neither {ORIGIN_TOPIC!r} nor {PARK_SOURCE!r}: it "
            "was not parked or dead-lettered by streamapp, so its origin is unknown"
        )
    if origin not in topics:
        raise ReplayError(
            f"record {record.where} comes from topic {origin!r}, which no agent of the app "
            f"reads (its topics: {', '.join(sorted(topics))}): run the replay with the app "
            "that parked it"
        )
    headers = Stamped([*stripped(record.headers), (REPLAYED, record.where.encode())])
    return Message(origin, record.value, record.key, headers)


def sent_back(
    records: Sequence[Delivery],
    topics: frozenset[str],
    *,
    stream: str | None = None,
    skip: str | None = None,
) -> list[Message]:
    """What sends parked ``records`` (one destination's partition, in order) back to
    their origin (:func:`back_to_origin`): only held stream ``stream``'s when given, its
    event of id ``skip`` marked :data:`HELD_SKIP` (the memory broker's replay)."""
    out = []
    for record in records:
        if stream is not None and _first(record.headers, HELD_STREAM) != stream.encode():
            continue
        headers = list(record.headers)
        if skip is not None and event_id(headers, record.value) == skip:
            headers.append((HELD_SKIP, b"skipped on purpose"))
        where = f"{record.topic}/{record.partition}/{record.position}"
        out.append(back_to_origin(Held(where, record.key, record.value, headers), topics))
    return out


def _first(headers: Headers, name: str) -> bytes | None:
    return next((v for n, v in headers if n == name), None)


ID_HEADERS = ("ce_id", "cloudEvents_id", "cloudEvents:id")
"""The CloudEvent id as a binary-mode header (Kafka, AMQP 0-9-1)."""


def event_id(headers: Headers, value: bytes | None) -> str | None:
    """The CloudEvent id of a record as held: its binary-mode id header, else the ``id``
    of a structured-mode JSON body (``application/cloudevents+json``, or a JSON object
    with ``specversion`` sent without that content type); None: neither."""
    for name, raw in headers:
        if name in ID_HEADERS:
            return raw.decode(errors="replace")
    if not value or value.lstrip()[:1] != b"{":
        return None
    try:
        body = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict) or "specversion" not in body or body.get("id") is None:
        return None
    return str(body["id"])


@dataclass(frozen=True)
class Offsets:
    """``--from`` or ``--until`` as given: one offset for every partition (``N``) and
    offsets of single partitions (``P:N``, which win)."""

    option: str
    every: int | None = None
    partitions: tuple[tuple[int, int], ...] = ()

    @classmethod
    def parse(cls, option: str, values: Sequence[str]) -> Offsets:
        """``values`` of ``option``; ReplayError naming the option for a bad one."""
        every: int | None = None
        partitions: dict[int, int] = {}
        for raw in values:
            part, sep, number = raw.rpartition(":")
            try:
                offset = int(number)
                partition = int(part) if sep else None
            except ValueError:
                offset, partition = -1, None
            if offset < 0 or (partition is not None and partition < 0):
                raise ReplayError(
                    f"{option} {raw!r}: give an offset (N, for every partition) or "
                    f"PARTITION:OFFSET, numbers of 0 or more, e.g. {option} 0:42"
                )
            if partition is None:
                every = offset
            else:
                partitions[partition] = offset
        return cls(option, every, tuple(sorted(partitions.items())))

    @property
    def given(self) -> bool:
        return self.every is not None or bool(self.partitions)

    def of(self, partition: int) -> int | None:
        """The offset given for ``partition`` (None: none)."""
        return dict(self.partitions).get(partition, self.every)


@dataclass
class ReplayReport:
    """What a run sent (or, dry, would send): a count per origin topic."""

    per_topic: Counter[str] = field(default_factory=Counter)

    @property
    def sent(self) -> int:
        return sum(self.per_topic.values())


Publish = Callable[[Message], Awaitable[None]]
"""A confirmed publish of one message (the app's sink): returns once confirmed."""


async def replay(
    records: AsyncIterator[Held],
    topics: frozenset[str],
    publish: Publish | None,
    on_record: Callable[[Held, Message], None] | None = None,
) -> ReplayReport:
    """Send every record of ``records`` back to its origin, one confirmed publish at a
    time, in the order read (``publish`` None: a dry run, nothing sent). ReplayError on
    the first record that cannot go back or is not confirmed, naming it and the count
    sent before it (``sent`` on the error)."""
    report = ReplayReport()
    async for record in records:
        try:
            message = back_to_origin(record, topics)
            if publish is not None:
                await publish(message)
        except ReplayError as exc:
            raise ReplayError(_stopped(str(exc), report), sent=report.sent) from exc
        except Exception as exc:
            raise ReplayError(
                _stopped(f"record {record.where} was not confirmed: {exc}", report),
                sent=report.sent,
            ) from exc
        report.per_topic[message.topic] += 1
        if publish is not None and record.settle is not None:
            try:
                await record.settle()
            except Exception as exc:
                raise ReplayError(
                    f"record {record.where} was sent back to {message.topic!r} but could not "
                    f"be settled ({exc}): it stays where it was, and a next run sends it "
                    f"again; {report.sent} record(s) were sent back, this one included",
                    sent=report.sent,
                ) from exc
        if on_record is not None:
            on_record(record, message)
    return report


def _stopped(why: str, report: ReplayReport) -> str:
    return f"{why}; {report.sent} record(s) were sent back before it, each once"
