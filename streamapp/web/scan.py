"""``GET /tables/{table}?prefix=&limit=&cursor=``: the whole table, a page at a time.

Partition by partition, in key order: partitions owned here are read from the store,
the others are asked of their owners (``only=P``, never forwarded twice), so any worker
gives the whole table (one version, as a key lookup answers it). ``cursor`` is
(partition, last key), :mod:`streamapp.web.cursor`.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from ..engine.served import phase_of, serving_tables
from ..errors import StoreError
from ..tables.table import scan
from .cursor import decode_cursor, encode_cursor
from .endpoint import STALE_HEADER, TableEndpoint, answer_early, check_length, flag, int_param
from .owner import FORWARDED, ask_owner
from .responses import (
    VERSION_HEADER,
    error,
    json_response,
    store_failed,
    stored_answer,
    unavailable,
)

STALE = web.RequestKey("stale", float)
"""A scan's request: the longest unconfirmed time of a local page it answered."""
SCAN_LIMIT = 100
"""Items a page holds when ``limit`` is not given."""
SCAN_LIMIT_MAX = 1000
"""The most items a page holds (a larger ``limit`` is 400)."""


class ScanEndpoint(TableEndpoint):
    """``GET /tables/{table}``: a page of the table's items (see the module)."""

    async def get(self, request: web.Request) -> web.Response:
        name = self.name(request)
        prefix = request.query.get("prefix", "")
        check_length("prefix", prefix)
        limit = int_param(request, "limit", SCAN_LIMIT)
        if not 1 <= limit <= SCAN_LIMIT_MAX:
            answer_early(error(400, f"limit must be between 1 and {SCAN_LIMIT_MAX}"))
        try:
            start_p, after = decode_cursor(request.query.get("cursor"))
        except ValueError:
            answer_early(error(400, "cursor is not one this worker gave"))
        version = self.version(request, name)
        agent, _ = self.assignment.app.tables[self.route(name, version).label]
        count = agent.topic.partitions
        only = request.query.get("only")
        partitions = range(count) if only is None else [int_param(request, "only", 0)]
        if only is not None and not 0 <= partitions[0] < count:
            answer_early(error(400, f"only must be a partition below {count}"))
        if self.assignment.rebalancing:
            answer_early(unavailable("the group is rebalancing"), version)
        items: list[dict[str, Any]] = []
        covered: list[int] = []
        cursor: str | None = None
        for p in partitions:
            if p < start_p:
                continue
            want = limit - len(items)
            first = after if p == start_p else None
            got = await self.page(request, name, version, p, prefix, first, want)
            if got is None:  # owners unknown on this transport: this worker's only
                continue
            covered.append(p)
            items += got[:want]
            if len(got) > want or len(items) == limit:
                cursor = encode_cursor(p, items[-1]["key"].encode())
                break
        headers = {VERSION_HEADER: str(version)}
        if STALE in request:
            headers[STALE_HEADER] = f"{request[STALE]:.1f}"
        return json_response(
            {
                "table": name,
                "version": version,
                "prefix": prefix,
                "partitions": covered,
                "items": items,
                "cursor": cursor,
            },
            200,
            **headers,
        )

    async def page(
        self,
        request: web.Request,
        name: str,
        version: int,
        p: int,
        prefix: str,
        after: bytes | None,
        want: int,
    ) -> list[dict[str, Any]] | None:
        """Up to ``want`` + 1 items of partition ``p`` (one more: is there a next page?);
        None when another worker owns it and this transport keeps no directory of owners."""
        routing = self.route(name, version)
        agent, _ = self.assignment.app.tables[routing.label]
        task = self.assignment.tasks.get((agent.topic.name, p))
        if task is not None:
            table = self.local(name, version)
            ptables = None if table is None else serving_tables(task, table)
            if table is None or ptables is None:
                phase = "not declared here" if table is None else phase_of(task, table).value
                answer_early(
                    unavailable(
                        f"partition {p} of table {name!r} version {version} is {phase}",
                        partition=p,
                        phase=phase,
                    ),
                    version,
                )
            stale = self.confirmed(p, version, flag(request, "stale_ok"))
            if stale is not None:  # the page's answer is marked (get)
                request[STALE] = max(stale, request.get(STALE, 0.0))
            try:
                rows = scan(
                    ptables.store,
                    table.data_space,
                    prefix=prefix.encode(),
                    after=after,
                    limit=want + 1,
                )
            except StoreError as exc:
                answer_early(store_failed(name, p, exc), version)
            return [
                {"key": k.decode(), "value": stored_answer(table, raw), "partition": p}
                for k, raw in rows
            ]
        if "only" in request.query or FORWARDED in request.headers:
            answer_early(
                error(421, f"partition {p} of table {name!r} is not owned here", partition=p)
            )
        if self.assignment.directory is None:
            return None
        owner = self.assignment.remote_owner(routing.label, p)
        if owner is None:
            answer_early(
                unavailable(f"the owner of partition {p} of {name!r} is not known yet"), version
            )
        query = {
            "prefix": prefix,
            "only": str(p),
            "limit": str(min(want + 1, SCAN_LIMIT_MAX)),
            "version": str(version),
        }
        if after is not None:
            query["cursor"] = encode_cursor(p, after)
        if flag(request, "stale_ok"):
            query["stale_ok"] = "1"
        answer = await ask_owner(request, owner, f"/tables/{name}", query, p)
        if answer.status != 200 or answer.body is None:
            answer_early(answer, version)
        body = orjson.loads(answer.body)  # type: ignore[arg-type]
        page: list[dict[str, Any]] = body["items"]
        return page
