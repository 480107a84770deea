"""Spans of a worker's table requests, when tracing is on (:mod:`streamapp.tracing`).

Each request under ``/tables`` is a server span named by its route (``GET
/tables/{table}/{key}``), the child of the W3C ``traceparent`` header it came with; a
lookup this worker forwards to the key's owner (:mod:`streamapp.web.owner`) is a client
span inside it whose context goes along in the request's headers, so the owner's span is
its child: one trace across the workers. Tracing off, there is no middleware at all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from ..tracing import Tracer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def middlewares(trace: Tracer | None) -> list[Middleware]:
    """The tracing middleware (none when ``trace`` is None: tracing off)."""
    if trace is None:
        return []

    @web.middleware
    async def traced(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith("/tables"):
            return await handler(request)
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else request.path
        attributes = {"http.request.method": request.method, "http.route": route}
        with trace.serve(f"{request.method} {route}", request.headers, attributes) as span:
            response = await handler(request)
            span.answered(response.status)
            return response

    return [traced]
