"""An event's ``data`` as message bytes, by its content type (every binary-mode codec),
and the other way: JSON data read when the handler first asks for it (:func:`lazy_json`)."""

from __future__ import annotations

import functools
from typing import Any

import orjson

from ..errors import DataError
from ..events import Event, Unread


def encode_data(event: Event) -> bytes | None:
    """The event's data as the bytes a binary-mode message carries (JSON for JSON
    content types); TypeError when structured data has no JSON content type."""
    data = event.data  # a lazy event's data read here: bad JSON is a DataError (a send)
    if data is None or isinstance(data, bytes):
        return data
    if is_json_type(event.datacontenttype):
        return orjson.dumps(data)
    raise TypeError(
        f"event {event.id}: data of type {type(data).__name__} needs a JSON "
        f"datacontenttype, got {event.datacontenttype!r}"
    )


@functools.lru_cache(maxsize=64)  # a topic has few content types; this runs per record
def is_json_type(content_type: str | None) -> bool:
    """True for ``application/json``, ``text/json`` and any ``*+json`` type (parameters ignored)."""
    if content_type is None:
        return False
    base = content_type.split(";", 1)[0].strip().lower()
    return base in ("application/json", "text/json") or base.endswith("+json")


def lazy_json(value: bytes) -> Unread:
    """JSON data of a binary-mode message, parsed when first read
    (:class:`~streamapp.events.LazyEvent`)."""
    return Unread(value, read_json)


def read_json(event: Event, raw: Any) -> Any:
    """``raw`` JSON bytes of ``event`` parsed; DataError naming the event when they are
    not JSON (the delivery is then NOT_DELIVERABLE, under the agent's failure policy)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DataError(
            f"data of event {event.id} is not valid JSON ({event.datacontenttype}): {exc}"
        ) from None
