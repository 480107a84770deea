"""CloudEvents over Kafka: binary content mode (``ce_`` headers) and structured JSON mode.

A fast path of our own instead of the SDK's decoder (see PITFALLS.md): the mode is decided
by ``content-type`` as the spec says, only ``ce_`` headers are decoded (a foreign binary
header never breaks a record), and the record key is never injected into the event. A
record with neither ``ce_`` headers nor a structured content type whose value is a JSON
object carrying ``specversion`` is a structured event too: the CloudEvents SDK's
``cloudevents.v1.kafka.to_structured`` writes those (:func:`streamapp.codecs.structured.sniff`).
The trace context (``ce_traceparent``, ``ce_tracestate``: the distributed-tracing
extension) is an extension like any other; a header of it that is not text is dropped and
the event decoded without it. Decoding raises :class:`DecodeError` with a reason; it never
raises anything else. Binary-mode JSON data is parsed when first read
(:func:`~.data.lazy_json`): data that is not JSON raises
:class:`~streamapp.errors.DataError` there, in the handler.
"""

from __future__ import annotations

from typing import Any, NoReturn

from ..errors import DecodeError
from ..events import SPECVERSION, TRACE_CONTEXT, Event, build_event
from ..records import Headers
from . import structured
from .data import encode_data, is_json_type, lazy_json

STRUCTURED = "application/cloudevents"


def decode(
    key: bytes | None, value: bytes | None, headers: Headers, *, parse_json: bool = True
) -> Event:
    """The CloudEvent in one Kafka record, or :class:`DecodeError` saying why not.
    ``parse_json=False`` leaves binary-mode JSON data as its bytes, for readers that
    decode it themselves (typed agents: :mod:`streamapp.agents.typed`)."""
    # The hot path: one pass, the core attributes straight into their slots (no dict of
    # attributes built and popped again), extensions into a dict of their own.
    core: list[str | None] = [None] * _CORE_COUNT
    extensions: dict[str, str] = {}
    content_type: str | None = None
    try:
        for name, raw in headers:
            slot = _CORE_SLOT.get(name)
            if slot is not None:
                core[slot] = raw.decode()
            elif name[:3] == "ce_":  # the binding writes lower case
                extensions[name[3:]] = raw.decode()
            else:
                lname = name.lower()
                if lname == "content-type":
                    content_type = raw.decode()
                elif lname[:3] == "ce_":  # another case: the general path
                    return _decode_attributes(value, headers, parse_json)
    except (UnicodeDecodeError, AttributeError):
        return decode(key, value, _readable(headers), parse_json=parse_json)
    event_id, source, type_, spec, subject, time, _, dataschema = core
    if not (event_id and source and type_ and spec == SPECVERSION) or (
        content_type is not None and content_type.lower().startswith(STRUCTURED)
    ):
        return _decode_attributes(value, headers, parse_json)  # it says what is wrong
    data = _data(value, content_type, parse_json)
    if "streamversion" in extensions:
        _check_version(extensions["streamversion"])
    return build_event(
        event_id,
        source,
        type_,
        SPECVERSION,
        subject,
        time,
        content_type if content_type is not None else core[_DATACONTENTTYPE],
        dataschema,
        data,
        extensions,
    )


_CORE = ("id", "source", "type", "specversion", "subject", "time", "datacontenttype", "dataschema")
_CORE_COUNT = len(_CORE)
_CORE_SLOT = {"ce_" + name: i for i, name in enumerate(_CORE)}
"""The ``ce_`` header of each core attribute, to its place in :func:`decode`'s list."""
_DATACONTENTTYPE = _CORE.index("datacontenttype")


def _data(value: bytes | None, content_type: str | None, parse_json: bool) -> Any:
    """A binary-mode record's data: JSON parsed when first read for a JSON content type
    (unless ``parse_json`` is False), else the bytes; None for an empty value."""
    if not value:
        return None  # an empty value is an event without data
    if parse_json and is_json_type(content_type):
        return lazy_json(value)
    return value


def _check_version(version: str) -> None:
    if not (version.isascii() and version.isdigit() and int(version) >= 1):
        raise DecodeError(f"streamversion {version!r} is not a positive integer")


def _decode_attributes(value: bytes | None, headers: Headers, parse_json: bool) -> Event:
    """The general path, for what the hot path does not take: ``ce_`` headers in another
    case, a missing or bad attribute (:func:`~streamapp.codecs.structured.from_attributes`
    names it), a structured or unmarked record."""
    content_type: str | None = None
    attrs: dict[str, str] = {}
    try:
        for name, raw in headers:
            if name[:3] == "ce_":
                attrs[name[3:]] = raw.decode()
                continue
            lname = name.lower()
            if lname == "content-type":
                content_type = raw.decode()
            elif lname[:3] == "ce_":
                attrs[lname[3:]] = raw.decode()
    except (UnicodeDecodeError, AttributeError):
        return _decode_attributes(value, _readable(headers), parse_json)
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
    return structured.from_attributes(attrs, _data(value, content_type, parse_json))


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


_TRACE_HEADERS = frozenset("ce_" + name for name in TRACE_CONTEXT)


def _readable(headers: Headers) -> Headers:
    """``headers`` less a trace context header (``ce_traceparent``, ``ce_tracestate``)
    that is not UTF-8 text: a broken trace context is ignored, never the event's failure.
    Raises the DecodeError naming any other unreadable header."""
    kept = [(n, v) for n, v in headers if n.lower() not in _TRACE_HEADERS or _is_text(v)]
    if len(kept) == len(headers):
        _bad_header(headers)
    return kept


def _is_text(raw: bytes | None) -> bool:
    if not isinstance(raw, bytes):
        return False
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


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
