"""AMQP messages as the engine's bytes: headers, key and body, both ways.

A message's key (the stream id, what Kafka keeps as the record key) travels as the
``streamapp-key`` header; the ``content_type`` property is the pseudo-header
``content-type`` (see :mod:`streamapp.codecs.amqp`). Header values are sent as
strings when they are UTF-8 text, else as byte arrays, and read back as bytes.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from aio_pika import DeliveryMode, Message
from aiormq import spec

from ...codecs.amqp import CONTENT_TYPE, PREFIXES

KEY_HEADER = "streamapp-key"
PERSISTENT = int(DeliveryMode.PERSISTENT)


def to_properties(key: bytes | None, headers: Sequence[tuple[str, bytes]]) -> Any:
    """The ``Basic.Properties`` of a persistent message with a fresh ``message_id`` (one
    per publish attempt: the broker's returns are matched by it; the CloudEvent id
    travels in the headers). What the sink publishes, without a client Message object."""
    table, content_type = _table(key, headers)
    return spec.Basic.Properties(
        headers=table,
        content_type=content_type,
        delivery_mode=PERSISTENT,
        message_id=uuid.uuid4().hex,
    )


def to_message(
    value: bytes | None, key: bytes | None, headers: Sequence[tuple[str, bytes]]
) -> Message:
    """The same message as :func:`to_properties` describes, as an aio-pika Message."""
    table, content_type = _table(key, headers)
    return Message(
        value or b"",
        headers=table,
        content_type=content_type,
        delivery_mode=DeliveryMode.PERSISTENT,
        message_id=uuid.uuid4().hex,
    )


def _table(
    key: bytes | None, headers: Sequence[tuple[str, bytes]]
) -> tuple[dict[str, Any], str | None]:
    """The AMQP header table (with the key) and the ``content_type`` property."""
    table: dict[str, Any] = {}
    content_type: str | None = None
    for name, raw in headers:
        if name.lower() == CONTENT_TYPE:
            content_type = bytes(raw).decode("utf-8", "replace")
        else:
            table[name] = _amqp_value(raw)
    if key is not None:
        table[KEY_HEADER] = _amqp_value(key)
    return table, content_type


def from_message(
    body: bytes, headers: Mapping[str, Any] | None, content_type: str | None
) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
    """``(key, value, headers)`` of a received message. Without a ``streamapp-key``
    header the key is the event's stream id (``streamid``, else ``subject``)."""
    out: list[tuple[str, bytes]] = []
    key: bytes | None = None
    if headers:
        for name, raw in headers.items():
            value = raw.encode() if type(raw) is str else _bytes(raw)
            if name == KEY_HEADER:
                key = value
            else:
                out.append((name, value))
    if content_type is not None:
        out.append((CONTENT_TYPE, content_type.encode()))
    if key is None:
        key = _stream_id(out)
    return key, (body or None), out


def _stream_id(headers: list[tuple[str, bytes]]) -> bytes | None:
    """The ``streamid`` attribute among CloudEvents headers, else ``subject``."""
    found: dict[str, bytes] = {}
    for name, value in headers:
        lname = name.lower()
        if lname[:12] in PREFIXES and lname[12:] in ("streamid", "subject"):
            found[lname[12:]] = value
    return found.get("streamid", found.get("subject"))


def _amqp_value(raw: bytes) -> str | bytearray:
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return bytearray(raw)


def _bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if value is None:
        return b""
    return str(value).encode()
