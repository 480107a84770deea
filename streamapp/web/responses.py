"""JSON answers shared by every endpoint of a worker."""

from __future__ import annotations

from typing import Any

import msgspec
import orjson
from aiohttp import web

RETRY_AFTER_S = 1


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


def _jsonable(value: Any) -> Any:
    """What orjson cannot write itself: typed table values (msgspec Structs and the like)."""
    return msgspec.to_builtins(value)
