"""JSON answers shared by every endpoint of a worker, and how a table view's answers
name their version and carry a stored value."""

from __future__ import annotations

from typing import Any

import msgspec
import orjson
from aiohttp import web

from ..errors import StoreError
from ..tables.table import JsonCodec, Table

RETRY_AFTER_S = 1
VERSION_HEADER = "Streamapp-Table-Version"
"""The table version an answer comes from (or would): a contract, named in every answer
of a table view."""


def json_response(body: Any, status: int = 200, **headers: str) -> web.Response:
    return web.Response(
        body=orjson.dumps(body, default=_jsonable),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def error(status: int, why: str, **extra: Any) -> web.Response:
    """A JSON error: ``{"error": why, ...extra}``."""
    return json_response({"error": why, **extra}, status)


def unavailable(why: str, **extra: Any) -> web.Response:
    """503 with Retry-After: the answer exists, just not here and now."""
    return json_response({"error": why, **extra}, 503, **{"Retry-After": str(RETRY_AFTER_S)})


def stored_answer(table: Table[Any], raw: bytes) -> Any:
    """A stored value as the answer's JSON writes it: a JSON table's own bytes as they
    are (its codec wrote them with ``orjson.dumps``, which writes what it reads back
    byte for byte: decoding and encoding them again would give the same bytes), any
    other codec's value decoded (``msgspec`` writes typed values as JSON)."""
    if type(table.codec) is JsonCodec:
        return orjson.Fragment(raw)
    return table.codec.loads(raw)


def versioned(response: web.Response, version: int | None) -> web.Response:
    """``response`` with the table version that served it (or would): the owner's, when
    forwarded."""
    if version is not None and VERSION_HEADER not in response.headers:
        response.headers[VERSION_HEADER] = str(version)
    return response


def store_failed(table: str, partition: int, exc: StoreError) -> web.Response:
    """503 for a read its store failed: never a 500, never a value from a damaged store
    (a corrupt one told its partition task, which rebuilds it meanwhile)."""
    return unavailable(
        f"partition {partition} of table {table!r} cannot be read now: {exc}",
        partition=partition,
    )


def _jsonable(value: Any) -> Any:
    """What orjson cannot write itself: typed table values (msgspec Structs and the like)."""
    return msgspec.to_builtins(value)
