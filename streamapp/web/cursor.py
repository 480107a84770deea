"""A scan's cursor: where its next page starts (a partition and the last key given),
opaque to the client, checked when it comes back."""

from __future__ import annotations

import base64
import binascii

import orjson


def encode_cursor(partition: int, key: bytes) -> str:
    """The cursor of the page after ``key`` of ``partition``."""
    raw = orjson.dumps({"p": partition, "k": key.hex()})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> tuple[int, bytes | None]:
    """Where ``cursor`` starts (no cursor: the first partition's first key); ValueError
    for one this worker did not give."""
    if not cursor:
        return 0, None
    try:
        body = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        return int(body["p"]), bytes.fromhex(body["k"])
    except (ValueError, KeyError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise ValueError(f"not a cursor of this worker: {cursor!r}") from None
