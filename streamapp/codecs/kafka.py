"""CloudEvents over Kafka: binary content mode (``ce_`` headers) and structured JSON mode.

A fast path of our own instead of the SDK's decoder (see PITFALLS.md): the mode is decided
by ``content-type`` as the spec says, only ``ce_`` headers are decoded (a foreign binary
header never breaks a record), and the record key is never injected into the event. A
record with neither ``ce_`` headers nor a structured content type whose value is a JSON
object carrying ``specversion`` is a structured event too: the CloudEvents SDK's
``cloudevents.v1.kafka.to_structured`` writes those (:func:`streamapp.codecs.structured.sniff`).
Decoding raises :class:`DecodeError` with a reason; it never raises anything else.
"""

from __future__ import annotations

from typing import Any, NoReturn

import orjson

from ..errors import DecodeError
from ..events import Event
from ..records import Headers
from . import structured
from .data import encode_data, is_json_type

STRUCTURED = "application/cloudevents"


def decode(
    key: bytes | None, value: bytes | None, headers: Headers, *, parse_json: bool = True
) -> Event:
    """The CloudEvent in one Kafka record, or :class:`DecodeError` saying why not.
    ``parse_json=False`` leaves binary-mode JSON data as its bytes, for readers that
    decode it themselves (typed agents: :mod:`streamapp.typed`)."""
    content_type: str | None = None
    attrs: dict[str, str] = {}
    try:
        for name, raw in headers:
            if name[:3] == "ce_":  # the binding writes lower case: the fast path
                attrs[name[3:]] = raw.decode()
                continue
            lname = name.lower()
            if lname == "content-type":
                content_type = raw.decode()
            elif lname[:3] == "ce_":
                attrs[lname[3:]] = raw.decode()
    except (UnicodeDecodeError, AttributeError):
        _bad_header(headers)
    if content_type is not None and content_type.lower().startswith(STRUCTURED):
        return _structured(content_type, value)
    if not attrs:
        sniffed = structured.sniff(value, content_type)
        if sniffed is None:
            raise DecodeError(
                "not a CloudEvent: no ce_ headers, no structured content-type, and the value "
                "is not a JSON object with specversion"
            )
        return sniffed
    if content_type is not None:
        attrs["datacontenttype"] = content_type
    data: Any = value or None  # an empty value is an event without data
    if data is not None and parse_json and is_json_type(content_type):
        try:
            data = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise DecodeError(f"data is not valid JSON ({content_type}): {exc}") from None
    return structured.from_attributes(attrs, data)


def encode(event: Event) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
    """``(key, value, headers)`` of ``event`` in binary content mode; key = stream id."""
    headers = [
        ("ce_" + name, value.encode())
        for name, value in event.attributes().items()
        if name != "datacontenttype"
    ]
    if event.datacontenttype is not None:
        headers.append(("content-type", event.datacontenttype.encode()))
    value = encode_data(event)
    sid = event.stream_id
    return (sid.encode() if sid is not None else None), value, headers


def encode_structured(event: Event) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
    """``(key, value, headers)`` of ``event`` in structured JSON mode."""
    sid = event.stream_id
    headers = [("content-type", b"application/cloudevents+json; charset=utf-8")]
    return (sid.encode() if sid is not None else None), structured.to_json(event), headers


def _structured(content_type: str, value: bytes | None) -> Event:
    if not content_type.lower().split(";", 1)[0].strip().endswith("+json"):
        raise DecodeError(f"unsupported structured format {content_type!r} (only JSON)")
    if value is None:
        raise DecodeError("structured CloudEvent with an empty value")
    return structured.from_json(value)


def _bad_header(headers: Headers) -> NoReturn:
    for name, raw in headers:
        if name.lower()[:3] == "ce_" or name.lower() == "content-type":
            _text(name, raw)
    raise DecodeError("malformed headers")


def _text(name: str, raw: bytes | None) -> str:
    if raw is None:
        raise DecodeError(f"header {name!r} has no value")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise DecodeError(f"header {name!r} is not valid UTF-8") from None
