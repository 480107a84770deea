"""The HTTP face of one worker: health, status, metrics and table views.

A view reads the store, never the open batch, so it shows state consistent with the
checkpoint. While the key's partition restores, catches up or is being handed over here,
it answers 503 with Retry-After; when another worker owns it, 421 (routing to the owner
comes with the views issue). Views know the worker's :class:`Assignment`, no transport.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from ..engine.assignment import Assignment
from . import health
from .metrics import CONTENT_TYPE, WorkerMetrics
from .responses import json_response, unavailable

__all__ = ["json_response", "make_app", "unavailable"]


def make_app(
    assignment: Assignment,
    worker_id: str,
    history: Callable[[], dict[str, object]] | None = None,
    *,
    metrics: WorkerMetrics | None = None,
) -> web.Application:
    """The aiohttp application of one worker."""
    if metrics is None:
        metrics = WorkerMetrics()
    metrics.watch(assignment)

    async def table_get(request: web.Request) -> web.Response:
        name, key = request.match_info["table"], request.match_info["key"]
        if name not in assignment.app.tables:
            return json_response({"error": f"no table named {name!r}"}, 404)
        _, table = assignment.app.tables[name]
        partition, task = assignment.owner_of(name, key)
        if task is None and assignment.rebalancing:
            return unavailable(
                f"the group is rebalancing; partition {partition} of {name!r} has no owner yet"
            )
        if task is None:
            return json_response(
                {
                    "error": f"partition {partition} of table {name!r} is not owned by this worker",
                    "partition": partition,
                },
                421,
            )
        tables = task.tables
        if not task.phase.serves or tables is None:
            return unavailable(f"partition {partition} of table {name!r} is {task.phase.value}")
        raw = tables.store.get(table.data_space, key.encode())
        if raw is None:
            return json_response({"error": f"key {key!r} not found in table {name!r}"}, 404)
        return json_response(table.codec.loads(raw))

    async def scrape(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    health.add_routes(app, assignment, worker_id, history)
    app.router.add_get("/metrics", scrape)
    app.router.add_get("/tables/{table}/{key}", table_get)
    return app
