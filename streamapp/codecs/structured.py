"""CloudEvents in structured JSON mode (``application/cloudevents+json``), any transport.

The event store keeps events in this form, Kafka reads it as structured mode, and the
``streamapp store append`` command takes it line by line. Parsing raises
:class:`DecodeError` with a reason, never anything else.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson

from ..errors import DecodeError
from ..events import REQUIRED, SPECVERSION, TRACE_CONTEXT, Event, _Unfrozen, build_event


def to_json(event: Event) -> bytes:
    """``event`` as one structured-mode JSON object (bytes data as ``data_base64``)."""
    body: dict[str, Any] = dict(event.attributes())
    if isinstance(event.data, bytes):
        body["data_base64"] = base64.b64encode(event.data).decode()
    elif event.data is not None:
        body["data"] = event.data
    return orjson.dumps(body)


def from_json(value: bytes | str) -> Event:
    """The event of one structured-mode JSON object, or DecodeError saying why not."""
    try:
        body = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"structured CloudEvent is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise DecodeError("structured CloudEvent is not a JSON object")
    return from_dict(body)


def sniff(value: bytes | None, content_type: str | None) -> Event | None:
    """A structured event sent without a structured content type, or None if ``value``
    is not one: a JSON object carrying ``specversion``.

    The CloudEvents SDK's ``cloudevents.v1.kafka.to_structured`` writes such records:
    no ``ce_`` headers, and as content type nothing or the event's ``datacontenttype``
    (moved out of the JSON), which is put back here. Only called for a message that has
    no attribute headers, so a binary-mode event is never read this way.
    """
    if not value or value.lstrip()[:1] != b"{":
        return None
    try:
        body = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict) or "specversion" not in body:
        return None
    if content_type is not None:
        body.setdefault("datacontenttype", content_type)
    return from_dict(body)


def from_stored(value: bytes) -> Event:
    """An event as the event store keeps it (:func:`to_json` of an appended Event): its
    fields put straight into the slots of a new Event, without re-checking every
    attribute, the replay's hot path. Anything unexpected falls back to
    :func:`from_json`, so a bad payload still gets its DecodeError."""
    try:
        body = _loads(value)
        pop = body.pop
        event: Any = _Unfrozen()
        event.id = pop("id")
        event.source = pop("source")
        event.type = pop("type")
        event.specversion = pop("specversion")
        event.subject = pop("subject", None)
        event.time = pop("time", None)
        event.datacontenttype = pop("datacontenttype", None)
        event.dataschema = pop("dataschema", None)
        data = pop("data", None)
        b64 = pop("data_base64", None)
        event.data = data if b64 is None else base64.b64decode(b64, validate=True)
        event.extensions = body
        if not (event.id and event.source and event.type and event.specversion == SPECVERSION):
            return from_json(value)
        event.__class__ = Event
    except Exception:
        return from_json(value)
    built: Event = event
    return built


_loads = orjson.loads


def from_dict(body: dict[str, Any]) -> Event:
    """The event of a parsed structured-mode object (``body`` is consumed)."""
    data: Any = body.pop("data", None)
    b64 = body.pop("data_base64", None)
    if b64 is not None:
        try:
            data = base64.b64decode(b64, validate=True)
        except (ValueError, TypeError):
            raise DecodeError("data_base64 is not valid base64") from None
    if not isinstance(body.get("specversion", ""), str):
        raise DecodeError("attribute 'specversion' must be a string")
    attrs: dict[str, str] = {}
    for name, val in body.items():
        if isinstance(val, (dict, list)) or val is None:
            if name in TRACE_CONTEXT:
                continue  # a broken trace context is ignored, never the event's failure
            raise DecodeError(f"attribute {name!r} must be a string, number or boolean")
        attrs[name] = val if isinstance(val, str) else orjson.dumps(val).decode()
    return from_attributes(attrs, data)


def from_attributes(attrs: dict[str, str], data: Any) -> Event:
    """The Event of decoded attributes; ``attrs`` is consumed (what remains: extensions)."""
    pop = attrs.pop
    required = [pop(name, "") for name in REQUIRED]
    if not all(required):
        missing = [name for name, value in zip(REQUIRED, required, strict=True) if not value]
        raise DecodeError(f"CloudEvent lacks required attribute(s): {', '.join(missing)}")
    event_id, source, type_, spec = required
    if spec != SPECVERSION:
        raise DecodeError(f"unsupported specversion {spec!r} (want 1.0)")
    version = attrs.get("streamversion")
    if version is not None and not (version.isascii() and version.isdigit() and int(version) >= 1):
        raise DecodeError(f"streamversion {version!r} is not a positive integer")
    return build_event(
        event_id,
        source,
        type_,
        SPECVERSION,
        pop("subject", None),
        pop("time", None),
        pop("datacontenttype", None),
        pop("dataschema", None),
        data,
        attrs,
    )
