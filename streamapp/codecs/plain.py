"""Plain records: topics whose records are not CloudEvents (``format="json"`` or ``"raw"``).

Most Kafka producers write a bare value and a key, no CloudEvents headers. A plain
topic's record becomes an :class:`~streamapp.events.Event` here:

- ``id``: ``topic/partition/position`` of the record (unique per topic; a copy that comes
  back through the retry chain is a new record of its topic, with a new id);
- ``source``: the topic's name; ``type``: the value's ``type_field`` when the topic names
  one (a string), else the topic's name;
- stream id (``streamid``): the value's ``stream_id_field`` when the topic names one (a
  string or an integer), else the record's key (UTF-8);
- ``data``: the value decoded as JSON (``format="json"``, any JSON value) or its bytes
  (``format="raw"``); ``datacontenttype`` says which.

A plain record has no ``streamversion``: exactly-once state rests on the source's
positions alone (Kafka: the transaction and the checkpointed offset), never on the
per-key stream-version rule. A record that is not JSON, has no stream id, or whose named
field is missing or of another type raises :class:`~streamapp.errors.DecodeError` with
the reason: NOT_DELIVERABLE, under the agent's failure policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from ..errors import DecodeError
from ..events import SPECVERSION, Event
from ..records import Delivery
from ..topics import TopicFormat, TopicSpec

JSON_TYPE = "application/json"
RAW_TYPE = "application/octet-stream"

PlainDecoder = Callable[[Delivery], Event]


def decoder(spec: TopicSpec) -> PlainDecoder:
    """The decoder of ``spec``'s records (a plain topic: ``spec.plain``)."""
    if spec.format is TopicFormat.RAW:
        return lambda delivery: _raw(spec, delivery)
    if spec.format is TopicFormat.JSON:
        return lambda delivery: _json(spec, delivery)
    raise ValueError(f"topic {spec.name!r} holds CloudEvents, not plain records")


def _where(delivery: Delivery) -> str:
    return f"{delivery.topic}/{delivery.partition}/{delivery.position}"


def _key(spec: TopicSpec, delivery: Delivery) -> str:
    key = delivery.key
    if not key:
        raise DecodeError(
            f"plain record of topic {spec.name!r} has no key (Kafka: the record's key; "
            "RabbitMQ: the streamapp-key header), and the topic names no stream_id_field: "
            "send a key, or declare app.topic(..., stream_id_field=...)"
        )
    try:
        return key.decode()
    except UnicodeDecodeError:
        raise DecodeError(f"plain record key {key[:40]!r} is not valid UTF-8") from None


def _event(
    delivery: Delivery, spec: TopicSpec, type_: str, stream_id: str, data: Any, ct: str
) -> Event:
    return Event(
        id=_where(delivery),
        source=spec.name,
        type=type_,
        specversion=SPECVERSION,
        datacontenttype=ct,
        data=data,
        extensions={"streamid": stream_id},
    )


def _raw(spec: TopicSpec, delivery: Delivery) -> Event:
    return _event(delivery, spec, spec.name, _key(spec, delivery), delivery.value, RAW_TYPE)


def _json(spec: TopicSpec, delivery: Delivery) -> Event:
    value = delivery.value
    if not value:
        raise DecodeError(f"plain record of topic {spec.name!r} has no value (a tombstone?)")
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"plain record of topic {spec.name!r} is not JSON: {exc}") from None
    type_ = spec.name
    if spec.type_field is not None:
        type_ = _field(spec, data, spec.type_field, "type_field", (str,))
    if spec.stream_id_field is not None:
        stream_id = _field(spec, data, spec.stream_id_field, "stream_id_field", (str, int))
    else:
        stream_id = _key(spec, delivery)
    return _event(delivery, spec, type_, stream_id, data, JSON_TYPE)


def _field(spec: TopicSpec, data: Any, name: str, setting: str, types: tuple[type, ...]) -> str:
    if not isinstance(data, dict):
        raise DecodeError(
            f"plain record of topic {spec.name!r} is a JSON {type(data).__name__}, not an "
            f"object: it has no field {name!r} ({setting})"
        )
    if name not in data:
        raise DecodeError(f"plain record of topic {spec.name!r} has no field {name!r} ({setting})")
    raw = data[name]
    if isinstance(raw, bool) or not isinstance(raw, types) or raw == "":
        kinds = " or ".join("a string" if t is str else "an integer" for t in types)
        raise DecodeError(
            f"plain record of topic {spec.name!r}: field {name!r} ({setting}) is "
            f"{raw!r}, not {kinds}"
        )
    return str(raw)


def encode(
    spec: TopicSpec, event: Event
) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
    """``(key, value, headers)`` of ``event`` sent to the plain topic ``spec``: its stream
    id as the key and its data alone as the value (JSON, or bytes as they are for
    ``format="raw"``), no headers; the event's other attributes are not sent."""
    sid = event.stream_id
    key = sid.encode() if sid is not None else None
    if spec.format is TopicFormat.RAW:
        data = event.data
        if data is not None and not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"topic {spec.name!r} is format='raw': an event sent to it needs bytes data, "
                f"not {type(data).__name__}"
            )
        return key, None if data is None else bytes(data), []
    try:
        return key, orjson.dumps(event.data), []
    except TypeError as exc:
        raise TypeError(
            f"topic {spec.name!r} is format='json': event {event.id}'s data is not JSON ({exc})"
        ) from None
