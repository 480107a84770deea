"""Middlewares of a worker's HTTP face: the bearer token, and JSON for every error.

With setting ``web_token`` (``STREAMAPP_WEB_TOKEN``) every request needs
``Authorization: Bearer <token>``, except ``/healthz`` (probes) and the page shell ``/``
(static HTML without data; its script sends the token, taken from the URL fragment,
which browsers never send to servers). The token is compared in constant time and
never logged. Any error, a missing route included, is a JSON body; an unexpected
exception is logged here with its traceback and answered 500 without it.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from .responses import error

log = logging.getLogger("streamapp.web")

OPEN_PATHS = frozenset({"/healthz", "/"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def middlewares(token: str | None) -> list[Middleware]:
    """A worker's middlewares: JSON errors, and the token check when ``token`` is set
    (without one it would pass every request on: a layer less for each to go through)."""
    return [json_errors, bearer(token)] if token else [json_errors]


def bearer(token: str | None) -> Middleware:
    """Refuses requests without the token (401) when ``token`` is set."""
    expected = token.encode() if token else None

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if expected is None or request.path in OPEN_PATHS:
            return await handler(request)
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            resp = error(401, "a bearer token is required (setting web_token)")
            resp.headers["WWW-Authenticate"] = 'Bearer realm="streamapp"'
            return resp
        return await handler(request)

    return check


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error as JSON: aiohttp's own (404, 405, 413, ...) and unexpected ones."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        resp = error(exc.status, exc.reason)
        for name in ("Allow", "Retry-After"):
            if name in exc.headers:
                resp.headers[name] = exc.headers[name]
        return resp
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return error(500, "internal error (logged by the worker)")
