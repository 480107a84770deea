"""Table views: ``GET /tables/{table}/{key}`` answered from the owner's committed state.

A view reads the store, never the open batch, so it shows state consistent with the
checkpoint. While the key's partition restores, catches up or is being handed over here,
it answers 503 with Retry-After; when another worker owns it, 421 (routing to the owner
comes with the views issue). Views know the worker's :class:`Assignment`, no transport.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from ..engine.assignment import Assignment


def json_response(body: Any, status: int = 200, **headers: str) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def unavailable(why: str) -> web.Response:
    return json_response({"error": why}, 503, **{"Retry-After": "1"})


def make_app(
    assignment: Assignment,
    worker_id: str,
    history: Callable[[], dict[str, object]] | None = None,
) -> web.Application:
    """The aiohttp application of one worker."""

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

    async def status(request: web.Request) -> web.Response:
        return json_response(
            {
                "worker": worker_id,
                "app": assignment.app.id,
                "ready": assignment.ready,
                "partitions": assignment.status(),
                "history": history() if history is not None else None,
            }
        )

    app = web.Application()
    app.router.add_get("/tables/{table}/{key}", table_get)
    app.router.add_get("/status", status)
    return app
