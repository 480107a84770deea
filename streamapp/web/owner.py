"""Forwarding a key's request to the worker that owns its partition.

The owner's answer is passed back as it is (status, JSON body, ``Retry-After``,
``Streamapp-Table-Version`` and ``X-Streamapp-*`` headers), with
``X-Streamapp-Forwarded-To`` naming the owner. The caller's ``Authorization`` goes
along. A forwarded request is never forwarded again:
a worker that no longer owns the partition answers 421, which becomes 503 +
Retry-After here (the directory is behind a rebalance), as does an owner that does not
answer. With tracing on the request carries the trace context (W3C ``traceparent``) of a
client span, the child of the lookup's own span (:mod:`streamapp.web.traced`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from yarl import URL

from .. import tracing
from .responses import unavailable

FORWARDED = "X-Streamapp-Forwarded"
SESSION = web.AppKey("forward_session", aiohttp.ClientSession)
_PASSED = ("Content-Type", "Retry-After", "Streamapp-Table-Version")


async def session_ctx(app: web.Application) -> AsyncIterator[None]:
    """One client session per worker app (its connection pool), closed on cleanup."""
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        app[SESSION] = session
        yield


async def forward(
    request: web.Request, owner: str, partition: int, timeout_s: float, *, version: int
) -> web.Response:
    """``request`` asked of ``owner``, pinned to table ``version`` (the owner answers the
    version this worker answers from, never another)."""
    url = URL(owner.rstrip("/") + request.raw_path, encoded=True)
    url = url.update_query(version=str(version))
    return await _ask(request, owner, url, partition, timeout_s)


async def ask_owner(
    request: web.Request,
    owner: str,
    path: str,
    query: dict[str, str],
    partition: int,
    timeout_s: float = 10.0,
) -> web.Response:
    """Ask ``owner`` for ``path`` with ``query`` on behalf of ``request`` (its token)."""
    url = URL(owner.rstrip("/")).with_path(path).with_query(query)
    return await _ask(request, owner, url, partition, timeout_s)


async def _ask(
    request: web.Request, owner: str, url: URL, partition: int, timeout_s: float
) -> web.Response:
    headers = {FORWARDED: "1"}
    auth = request.headers.get("Authorization")
    if auth:
        headers["Authorization"] = auth
    trace = tracing.active()
    if trace is None:
        return await _get(request, owner, url, partition, timeout_s, headers)
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else url.path
    attributes: dict[str, str | int] = {
        "server.address": owner, "http.route": route, "streamapp.partition": partition
    }  # fmt: skip
    with trace.ask(f"GET {route} (owner)", headers, attributes) as span:
        response = await _get(request, owner, url, partition, timeout_s, headers)
        span.answered(response.status)
        return response


async def _get(
    request: web.Request,
    owner: str,
    url: URL,
    partition: int,
    timeout_s: float,
    headers: dict[str, str],
) -> web.Response:
    try:
        async with request.app[SESSION].get(
            url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as r:
            body = await r.read()
            if r.status == 421:
                return unavailable(
                    f"partition {partition} is moving between workers; retry", partition=partition
                )
            out = {
                k: v for k, v in r.headers.items() if k in _PASSED or k.startswith("X-Streamapp-")
            }
            out["X-Streamapp-Forwarded-To"] = owner
            return web.Response(body=body, status=r.status, headers=out)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return unavailable(
            f"the owner of partition {partition} ({owner}) did not answer: "
            f"{type(exc).__name__}; retry",
            partition=partition,
        )
