"""Table views: ``GET /tables/{table}/{key}`` answered from the owner's committed state.

A view reads the store, never the open batch, so it shows state consistent with the
checkpoint. While the key's partition restores (or is being handed over) here, it
answers 503 with Retry-After; when another worker owns it, 421 (routing to the owner
comes with the views issue).
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from ..kafka.runner import BUSY, READY
from ..kafka.source import KafkaSource


def json_response(body: Any, status: int = 200, **headers: str) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def make_app(source: KafkaSource, worker_id: str) -> web.Application:
    """The aiohttp application of one worker."""

    async def table_get(request: web.Request) -> web.Response:
        name, key = request.match_info["table"], request.match_info["key"]
        if name not in source.app.tables:
            return json_response({"error": f"no table named {name!r}"}, 404)
        _, table = source.app.tables[name]
        partition, runner = source.owner_of(name, key)
        if runner is None and source.rebalancing:
            return json_response(
                {
                    "error": f"the group is rebalancing; partition {partition} of {name!r} has "
                    "no owner yet"
                },
                503,
                **{"Retry-After": "1"},
            )
        if runner is None:
            return json_response(
                {
                    "error": f"partition {partition} of table {name!r} is not owned by this worker",
                    "partition": partition,
                },
                421,
            )
        if runner.state not in (READY, BUSY) or runner.tables is None:
            return json_response(
                {"error": f"partition {partition} of table {name!r} is {runner.state}"},
                503,
                **{"Retry-After": "1"},
            )
        raw = runner.tables.store.get(table.data_space, key.encode())
        if raw is None:
            return json_response({"error": f"key {key!r} not found in table {name!r}"}, 404)
        return json_response(table.codec.loads(raw))

    async def status(request: web.Request) -> web.Response:
        parts = source.status()
        ready = not source.rebalancing and all(p["state"] in (READY, BUSY) for p in parts.values())
        return json_response(
            {"worker": worker_id, "app": source.app.id, "ready": ready, "partitions": parts}
        )

    app = web.Application()
    app.router.add_get("/tables/{table}/{key}", table_get)
    app.router.add_get("/status", status)
    return app
