"""The HTTP face of one worker: health, status, metrics and table views.

A view reads the store, never the open batch, so it shows state consistent with the
checkpoint. While the key's partition restores, catches up or is being handed over here,
it answers 503 with Retry-After; when another worker owns it, the request is forwarded
to the owner (:mod:`streamapp.web.owner`). Views know the worker's
:class:`Assignment`, no transport.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from .. import tracing
from .._version import streamapp_version
from ..engine.assignment import Assignment
from . import health, openapi, security, tables, traced
from . import owner as forward
from .explain import StoreFolds
from .metrics import CONTENT_TYPE, WorkerMetrics
from .responses import error, json_response, unavailable

__all__ = ["json_response", "make_app", "unavailable"]

PAGE = Path(__file__).with_name("page.html")
"""The page at ``/``: plain HTML and a little JavaScript, no build step."""


def make_app(
    assignment: Assignment,
    worker_id: str,
    history: Callable[[], dict[str, object]] | None = None,
    *,
    metrics: WorkerMetrics | None = None,
    token: str | None = None,
    folds: StoreFolds | None = None,
    data_dir: Path | None = None,
) -> web.Application:
    """The aiohttp application of one worker (``folds``: its app and event store, for
    answers folded from the store; ``data_dir``: where its table stores are, whose disk
    ``/readyz`` checks)."""
    if metrics is None:
        metrics = WorkerMetrics()
    metrics.watch(assignment, lambda: bool(health.readiness(assignment, data_dir)["ready"]))

    declared = [table for _, table in assignment.app.tables.values()]
    spec = openapi.document(assignment.app.id, streamapp_version(), declared)

    async def openapi_json(request: web.Request) -> web.Response:
        return json_response(spec)

    async def page(request: web.Request) -> web.Response:
        return web.Response(body=PAGE.read_bytes(), content_type="text/html", charset="utf-8")

    async def verify_report(request: web.Request) -> web.Response:
        """``POST /verify/report``: what ``streamapp verify --report`` found, for
        ``streamapp_verify_last_differences``."""
        try:
            body = await request.json()
            table, version = str(body["table"]), int(body["version"])
            differences = int(body["differ"]) + int(body["missing"])
        except (ValueError, KeyError, TypeError):
            return error(400, "give JSON {table, version, differ, missing} (streamapp verify)")
        metrics.verified(table, version, differences)
        return json_response({"table": table, "version": version, "differences": differences})

    async def scrape(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application(
        middlewares=[*traced.middlewares(tracing.active()), *security.middlewares(token)]
    )
    app.cleanup_ctx.append(forward.session_ctx)

    def last_stall() -> dict[str, object] | None:
        stall = metrics.last_stall
        return None if stall is None else stall.as_status()

    health.add_routes(
        app, assignment, worker_id, history, last_stall, metrics.operations, data_dir=data_dir
    )
    app.router.add_get("/metrics", scrape)
    app.router.add_post("/verify/report", verify_report)
    app.router.add_get("/openapi.json", openapi_json)
    app.router.add_get("/", page)
    tables.add_routes(app, assignment, worker_id, history, folds)
    return app
