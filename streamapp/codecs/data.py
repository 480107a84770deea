"""An event's ``data`` as message bytes, by its content type (every binary-mode codec)."""

from __future__ import annotations

import functools

import orjson

from ..events import Event


def encode_data(event: Event) -> bytes | None:
    """The event's data as the bytes a binary-mode message carries (JSON for JSON
    content types); TypeError when structured data has no JSON content type."""
    data = event.data
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
