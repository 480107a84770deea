"""CloudEvents on AMQP 0-9-1: ``cloudEvents_`` headers, ``content_type``, data as the body.

AMQP 0-9-1 has no official CloudEvents binding; we follow the AMQP 1.0 binding's names:
every attribute and extension is an application header named ``cloudEvents_<name>``
(``cloudEvents:<name>`` accepted on input), ``datacontenttype`` is the message's
``content_type`` property, and the data is the body. Attribute values are strings (the
``time`` attribute as RFC 3339, not AMQP 1.0's timestamp). A structured-mode body
(``content_type: application/cloudevents+json``) is accepted on input, and so is a body
that is a JSON object carrying ``specversion`` on a message without ``cloudEvents_``
headers or structured content type (:func:`streamapp.codecs.structured.sniff`). The trace
context (``cloudEvents_traceparent``, ``cloudEvents_tracestate``) is an extension like any
other; a header of it that is not text is dropped and the event decoded without it.

Here a message is a header list: the AMQP headers as ``(name, bytes)`` plus the
``content_type`` property as the pseudo-header ``content-type``, the one vocabulary of
:class:`~streamapp.engine.delivery.Delivery` (see :mod:`streamapp.transports.rabbitmq.wire`).
Decoding raises :class:`DecodeError` with a reason; it never raises anything else.
JSON data is parsed when first read, as the Kafka codec does (:mod:`streamapp.codecs.kafka`).
"""

from __future__ import annotations

from typing import Any, NoReturn

from ..errors import DecodeError
from ..events import TRACE_CONTEXT, Event
from ..records import Headers
from . import structured
from .data import encode_data, is_json_type, lazy_json

PREFIX = "cloudEvents_"
PREFIXES = ("cloudevents_", "cloudevents:")
"""Lower-cased prefixes accepted on input."""
CONTENT_TYPE = "content-type"
"""The pseudo-header that stands for the AMQP ``content_type`` property."""
STRUCTURED = "application/cloudevents"


def decode(value: bytes | None, headers: Headers, *, parse_json: bool = True) -> Event:
    """The CloudEvent in one AMQP message, or :class:`DecodeError` saying why not.
    ``parse_json=False`` leaves binary-mode JSON data as its bytes (as the Kafka codec)."""
    content_type: str | None = None
    attrs: dict[str, str] = {}
    try:
        for name, raw in headers:
            if name[:12] == PREFIX:  # what the binding writes: the fast path
                attr = name[12:].lower()
            else:
                lname = name.lower()
                if lname == CONTENT_TYPE:
                    content_type = raw.decode()
                    continue
                if lname[:12] not in PREFIXES:
                    continue
                attr = lname[12:]
            if not attr:
                raise DecodeError(f"header {name!r} names no attribute")
            attrs[attr] = raw.decode()
    except (UnicodeDecodeError, AttributeError):
        return decode(value, _readable(headers), parse_json=parse_json)
    if content_type is not None and content_type.lower().startswith(STRUCTURED):
        return _structured(content_type, value)
    if not attrs:
        sniffed = structured.sniff(value, content_type)
        if sniffed is None:
            raise DecodeError(
                "not a CloudEvent: no cloudEvents_ headers, no structured content_type, and "
                "the body is not a JSON object with specversion"
            )
        return sniffed
    if content_type is not None:
        attrs["datacontenttype"] = content_type
    content_type = attrs.get("datacontenttype")
    data: Any = value or None  # an empty body is an event without data
    if data is not None and parse_json and is_json_type(content_type):
        data = lazy_json(data)  # parsed when first read (a DataError there)
    return structured.from_attributes(attrs, data)


def encode(event: Event) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
    """``(key, body, headers)`` of ``event``; key = stream id, ``content-type`` = the
    ``content_type`` property (the sink maps it)."""
    headers = [
        (PREFIX + name, value.encode())
        for name, value in event.attributes().items()
        if name != "datacontenttype"
    ]
    if event.datacontenttype is not None:
        headers.append((CONTENT_TYPE, event.datacontenttype.encode()))
    body = encode_data(event)
    sid = event.stream_id
    return (sid.encode() if sid is not None else None), body, headers


def _structured(content_type: str, value: bytes | None) -> Event:
    if not content_type.lower().split(";", 1)[0].strip().endswith("+json"):
        raise DecodeError(f"unsupported structured format {content_type!r} (only JSON)")
    if not value:
        raise DecodeError("structured CloudEvent with an empty body")
    return structured.from_json(value)


def _readable(headers: Headers) -> Headers:
    """``headers`` less a trace context header (``cloudEvents_traceparent``,
    ``cloudEvents_tracestate``) that is not UTF-8 text: a broken trace context is ignored,
    never the event's failure. Raises the DecodeError naming any other unreadable header."""
    kept = [(n, v) for n, v in headers if not _trace_header(n) or _is_text(v)]
    if len(kept) == len(headers):
        _bad_header(headers)
    return kept


def _trace_header(name: str) -> bool:
    lname = name.lower()
    return lname[:12] in PREFIXES and lname[12:] in TRACE_CONTEXT


def _is_text(raw: bytes | None) -> bool:
    if not isinstance(raw, bytes):
        return False
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def _bad_header(headers: Headers) -> NoReturn:
    """Raise the DecodeError that names the header the fast path could not read."""
    for name, raw in headers:
        lname = name.lower()
        if lname == CONTENT_TYPE or lname[:12] in PREFIXES:
            _text(name, raw)
    raise DecodeError("a header could not be read")  # pragma: no cover (found above)


def _text(name: str, raw: bytes | None) -> str:
    if raw is None:
        raise DecodeError(f"header {name!r} has no value")
    try:
        return raw.decode("utf-8")
    except (UnicodeDecodeError, AttributeError):
        raise DecodeError(f"header {name!r} is not valid UTF-8 text") from None
