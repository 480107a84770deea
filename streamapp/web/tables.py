"""Table endpoints: the app's tables, one key's value, a paginated scan.

Every answer comes from committed state (the store), never an open batch. A key whose
partition this worker owns but that is not live (restoring, catching up) gets 503 with
Retry-After; a key of another worker's partition is forwarded to its owner when the
transport keeps a directory of owners (Kafka), else answered 421 naming the partition.

- ``GET /tables``: tables, partition counts, and the partitions this worker owns.
- ``GET /tables/{table}/{key}``: the value, plain JSON (a key of another worker's
  partition is forwarded to it, :mod:`streamapp.web.forward`). ``?min_version=N`` waits
  up to :data:`MIN_VERSION_WAIT_S` for the key's committed stream version to reach N (else
  503). ``?meta=1`` wraps the value with its partition, phase, version and checkpoint;
  the same facts are in ``X-Streamapp-*`` headers of every answer.
- ``GET /tables/{table}?prefix=&limit=&cursor=``: the whole table, merged across the
  workers, in partition then key order, a page at a time (partitions of other workers
  are asked of their owners); ``cursor`` from the previous page continues.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from typing import Any

import orjson
from aiohttp import web

from ..engine.assignment import Assignment
from ..engine.task import PartitionTask
from ..tables.partition import PartitionTables
from ..tables.table import Table, scan
from .forward import FORWARDED, ask_owner, forward
from .responses import error, json_response, unavailable

MAX_KEY_BYTES = 1024
"""Longer keys (and prefixes) are refused with 414."""
MIN_VERSION_WAIT_S = 5.0
"""How long ``?min_version=`` waits for the key's stream version."""
MIN_VERSION_POLL_S = 0.02
SCAN_LIMIT = 100
SCAN_LIMIT_MAX = 1000


def add_routes(app: web.Application, assignment: Assignment) -> None:
    tables = assignment.app.tables

    async def list_tables(request: web.Request) -> web.Response:
        owned: dict[str, dict[int, str]] = {}
        for (topic, partition), task in sorted(assignment.tasks.items()):
            owned.setdefault(topic, {})[partition] = task.phase.value
        return json_response(
            {
                "rebalancing": assignment.rebalancing,
                "tables": [
                    {
                        "name": name,
                        "help": table.help,
                        "agent": agent.name,
                        "topic": agent.topic.name,
                        "partitions": agent.topic.partitions,
                        "owned": {
                            str(p): phase for p, phase in owned.get(agent.topic.name, {}).items()
                        },
                        "owners": {
                            str(p): assignment.remote_owner(name, p)
                            for p in range(agent.topic.partitions)
                            if p not in owned.get(agent.topic.name, {})
                        },
                    }
                    for name, (agent, table) in sorted(tables.items())
                ],
            }
        )

    def _table(request: web.Request) -> Table[Any]:
        name = request.match_info["table"]
        if name not in tables:
            raise _Answer(error(404, f"no table named {name!r}", tables=sorted(tables)))
        return tables[name][1]

    def _serving(
        name: str, key: str, request: web.Request | None = None
    ) -> tuple[int, PartitionTask, PartitionTables]:
        """The live task owning ``key``, or an _Answer (421, 503, or, given ``request``,
        the owner's answer to it, forwarded)."""
        partition, task = assignment.owner_of(name, key)
        if task is None and assignment.rebalancing:
            raise _Answer(
                unavailable(
                    f"the group is rebalancing; partition {partition} of {name!r} has no owner yet",
                    partition=partition,
                )
            )
        if (
            task is None
            and request is not None
            and assignment.directory is not None
            and FORWARDED not in request.headers  # never forward twice
        ):
            owner = assignment.remote_owner(name, partition)
            if owner is None:
                raise _Answer(
                    unavailable(
                        f"the owner of partition {partition} of {name!r} is not known yet",
                        partition=partition,
                    )
                )
            raise _Forward(owner, partition)
        if task is None:
            raise _Answer(
                error(
                    421,
                    f"partition {partition} of table {name!r} is not owned by this worker",
                    partition=partition,
                )
            )
        ptables = task.tables_for(name)
        if not task.phase.serves or ptables is None:
            raise _Answer(
                unavailable(
                    f"partition {partition} of table {name!r} is {task.phase.value}",
                    partition=partition,
                    phase=task.phase.value,
                )
            )
        return partition, task, ptables

    async def get_key(request: web.Request) -> web.Response:
        try:
            table = _table(request)
            key = request.match_info["key"]
            _check_length("key", key)
            min_version = _int_param(request, "min_version", 0)
            meta = request.query.get("meta", "") not in ("", "0", "false")
            partition, task, ptables = _serving(table.name, key, request)
            version = ptables.committed_version(key)
            deadline = time.monotonic() + MIN_VERSION_WAIT_S
            while version < min_version:
                if time.monotonic() >= deadline:
                    return unavailable(
                        f"key {key!r} of table {table.name!r} is at stream version {version}, "
                        f"not yet {min_version} (waited {MIN_VERSION_WAIT_S:.0f}s)",
                        partition=partition,
                        version=version,
                    )
                await asyncio.sleep(MIN_VERSION_POLL_S)
                partition, task, ptables = _serving(table.name, key)  # may have moved
                version = ptables.committed_version(key)
        except _Answer as answer:
            return answer.response
        except _Forward as fwd:
            return await forward(request, fwd.owner, fwd.partition, MIN_VERSION_WAIT_S + 5)
        raw = ptables.store.get(table.data_space, key.encode())
        checkpoint = ptables.checkpoint.live
        headers = {
            "X-Streamapp-Partition": str(partition),
            "X-Streamapp-Phase": task.phase.value,
            "X-Streamapp-Version": str(version),
            "X-Streamapp-Checkpoint": "" if checkpoint is None else str(checkpoint),
        }
        if raw is None:
            resp = error(404, f"key {key!r} not found in table {table.name!r}")
            resp.headers.update(headers)
            return resp
        value = table.codec.loads(raw)
        if not meta:
            return json_response(value, 200, **headers)
        return json_response(
            {
                "table": table.name,
                "key": key,
                "value": value,
                "partition": partition,
                "phase": task.phase.value,
                "version": version,
                "checkpoint": checkpoint,
                "store_position": ptables.checkpoint.history,
            },
            200,
            **headers,
        )

    async def scan_table(request: web.Request) -> web.Response:
        """Partition by partition, in key order: partitions owned here are read from the
        store, the others are asked of their owners (``only=P``, never forwarded twice),
        so any worker gives the whole table. ``cursor`` is (partition, last key)."""
        try:
            table = _table(request)
            prefix = request.query.get("prefix", "")
            _check_length("prefix", prefix)
            limit = _int_param(request, "limit", SCAN_LIMIT)
            if not 1 <= limit <= SCAN_LIMIT_MAX:
                raise _Answer(error(400, f"limit must be between 1 and {SCAN_LIMIT_MAX}"))
            start_p, after = _decode_cursor(request.query.get("cursor"))
            agent, _ = tables[table.name]
            count = agent.topic.partitions
            only = request.query.get("only")
            partitions = range(count) if only is None else [_int_param(request, "only", 0)]
            if only is not None and not 0 <= partitions[0] < count:
                raise _Answer(error(400, f"only must be a partition below {count}"))
            if assignment.rebalancing:
                raise _Answer(unavailable("the group is rebalancing"))
            items: list[dict[str, Any]] = []
            covered: list[int] = []
            cursor: str | None = None
            for p in partitions:
                if p < start_p:
                    continue
                want = limit - len(items)
                got = await _page(request, table, p, prefix, after if p == start_p else None, want)
                if got is None:  # owners unknown on this transport: this worker's only
                    continue
                covered.append(p)
                items += got[:want]
                if len(got) > want or len(items) == limit:
                    cursor = _encode_cursor(p, items[-1]["key"].encode())
                    break
        except _Answer as answer:
            return answer.response
        return json_response(
            {
                "table": table.name,
                "prefix": prefix,
                "partitions": covered,
                "items": items,
                "cursor": cursor,
            }
        )

    async def _page(
        request: web.Request,
        table: Table[Any],
        p: int,
        prefix: str,
        after: bytes | None,
        want: int,
    ) -> list[dict[str, Any]] | None:
        """Up to ``want`` + 1 items of partition ``p`` (one more: is there a next page?)."""
        agent, _ = tables[table.name]
        task = assignment.tasks.get((agent.topic.name, p))
        if task is not None:
            ptables = task.tables_for(table.name)
            if not task.phase.serves or ptables is None:
                raise _Answer(
                    unavailable(
                        f"partition {p} of table {table.name!r} is {task.phase.value}",
                        partition=p,
                        phase=task.phase.value,
                    )
                )
            rows = scan(
                ptables.store, table.data_space, prefix=prefix.encode(), after=after, limit=want + 1
            )
            return [
                {"key": k.decode(), "value": table.codec.loads(raw), "partition": p}
                for k, raw in rows
            ]
        if "only" in request.query or FORWARDED in request.headers:
            raise _Answer(
                error(421, f"partition {p} of table {table.name!r} is not owned here", partition=p)
            )
        if assignment.directory is None:
            return None
        owner = assignment.remote_owner(table.name, p)
        if owner is None:
            raise _Answer(
                unavailable(f"the owner of partition {p} of {table.name!r} is not known yet")
            )
        query = {"prefix": prefix, "only": str(p), "limit": str(min(want + 1, SCAN_LIMIT_MAX))}
        if after is not None:
            query["cursor"] = _encode_cursor(p, after)
        answer = await ask_owner(request, owner, f"/tables/{table.name}", query, p)
        if answer.status != 200 or answer.body is None:
            raise _Answer(answer)
        body = orjson.loads(answer.body)  # type: ignore[arg-type]
        page: list[dict[str, Any]] = body["items"]
        return page

    app.router.add_get("/tables", list_tables)
    app.router.add_get("/tables/{table}", scan_table)
    app.router.add_get("/tables/{table}/{key}", get_key)


class _Answer(Exception):
    """An early answer (an error) out of a helper."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


class _Forward(Exception):
    """Another worker owns the key's partition: ask it."""

    def __init__(self, owner: str, partition: int) -> None:
        super().__init__(owner)
        self.owner, self.partition = owner, partition


def _check_length(what: str, value: str) -> None:
    if len(value.encode()) > MAX_KEY_BYTES:
        raise _Answer(
            error(414, f"{what} is longer than {MAX_KEY_BYTES} bytes", max_bytes=MAX_KEY_BYTES)
        )


def _int_param(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _Answer(error(400, f"{name} must be an integer, got {raw!r}")) from None
    if value < 0:
        raise _Answer(error(400, f"{name} must not be negative"))
    return value


def _encode_cursor(partition: int, key: bytes) -> str:
    raw = orjson.dumps({"p": partition, "k": key.hex()})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str | None) -> tuple[int, bytes | None]:
    if not cursor:
        return 0, None
    try:
        body = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        return int(body["p"]), bytes.fromhex(body["k"])
    except (ValueError, KeyError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise _Answer(error(400, "cursor is not one this worker gave")) from None
