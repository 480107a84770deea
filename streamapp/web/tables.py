"""Table endpoints: the app's tables, one key's value, a paginated scan.

Every answer comes from committed state (the store), never an open batch. A key whose
partition this worker owns but that is not live (restoring, catching up), or whose store
read failed (a corrupt block: the partition is rebuilt meanwhile), gets 503 with
Retry-After; a key of another worker's partition is forwarded to its owner when the
transport keeps a directory of owners (Kafka), else answered 421 naming the partition.

A table has versions (``Table(name, version=N)``); views answer from the table's active
version (:mod:`streamapp.version_states`, as the members directory shows the group:
:func:`streamapp.engine.served.group_states`, kept between lookups until what it comes
from changes: :mod:`streamapp.web.routes`), or from the version ``?version=N`` pins.
Every answer to a key names the version that served it or would serve it, in the header
:data:`VERSION_HEADER` (200s, 404s of a key, 503s). A key is forwarded to its owner
with the version, and the owner answers that version, never another; a partition
whose lane of that version is not live answers 503 + Retry-After.

- ``GET /tables``: each table's versions, partition counts, owners (:mod:`.listing`).
- ``GET /tables/{table}/{key}``: the value, plain JSON (a key of another worker's
  partition is forwarded to it, :mod:`streamapp.web.forward`). ``?version=N`` pins a
  version (404 naming the versions that exist when N is none of them).
  ``?min_version=N`` waits up to :data:`MIN_VERSION_WAIT_S` for the key's committed
  stream version to reach N (else 503). ``?meta=1`` wraps the value with its table
  version, partition, phase, stream version and checkpoint; the same facts are in
  ``X-Streamapp-*`` headers of every answer.
- Past its owner's lease (:mod:`streamapp.engine.lease`) a key answers 503 (``ownership of
  partition N not confirmed for X s``); ``?stale_ok=1`` answers, marked :data:`STALE_HEADER`.
- ``GET /tables/{table}?prefix=&limit=&cursor=``: the whole table (one version, as
  above), merged across the workers, in partition then key order, a page at a time
  (partitions of other workers are asked of their owners); ``cursor`` continues.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from ..engine.assignment import UNCONFIRMED, Assignment
from ..engine.phase import Phase
from ..engine.served import lane_of, lane_phase, phase_of, serving_tables
from ..engine.task import PartitionTask
from ..errors import StoreError
from ..partitioner import Partitioner
from ..tables.partition import PartitionTables
from ..tables.table import Table, scan
from .cursor import decode_cursor, encode_cursor
from .forward import FORWARDED, ask_owner, forward
from .held import held_answer
from .listing import listing
from .responses import (
    VERSION_HEADER,
    error,
    json_response,
    store_failed,
    stored_answer,
    unavailable,
    versioned,
)
from .routes import VersionRoutes

MIN_VERSION_WAIT_S = 5.0
"""How long ``?min_version=`` waits for the key's stream version."""
MIN_VERSION_POLL_S = 0.02
MAX_KEY_BYTES = 1024
"""Longer keys (and prefixes) are refused with 414."""
STALE_HEADER = "X-Streamapp-Stale"
"""On a ``?stale_ok=1`` answer past the owner's lease: the seconds not confirmed."""
STALE = web.RequestKey("stale", float)
"""A scan's request: the longest unconfirmed time of a local page it answered."""
SCAN_LIMIT = 100
SCAN_LIMIT_MAX = 1000
PARTITION_CACHE_KEYS = 10_000
"""The partitions of this many keys asked lately are remembered (murmur2 in Python is
about 1.5 us a short key); past that the memory starts again, empty."""


def add_routes(
    app: web.Application,
    assignment: Assignment,
    worker_id: str = "",
    history: Callable[[], dict[str, object]] | None = None,
) -> None:
    declared = assignment.app.tables
    tables = {(t.name, t.version): t for _, t in declared.values()}
    table_names = sorted({name for name, _ in tables})
    lowest_of = {
        name: min((t for (n, _), t in tables.items() if n == name), key=lambda t: t.version)
        for name in table_names
    }
    routes = VersionRoutes(assignment, worker_id)
    topics = {label: agent.topic for label, (agent, _) in declared.items()}
    partitions_of: dict[tuple[int, Partitioner], dict[str, int]] = {}
    """Per partition count and partitioner, the partitions of keys asked lately."""

    def owner_of(label: str, key: str) -> tuple[int, PartitionTask | None]:
        """:meth:`Assignment.owner_of`, with the partitions of recent keys remembered."""
        topic = topics[label]
        known = partitions_of.setdefault((topic.partitions, topic.partitioner), {})
        partition = known.get(key)
        if partition is None:
            if len(known) >= PARTITION_CACHE_KEYS:
                known.clear()
            partition = known[key] = topic.partition_of(key.encode())
        return partition, assignment.tasks.get((topic.name, partition))

    def names() -> list[str]:
        return list(table_names)

    def local(name: str, version: int) -> Table[Any] | None:
        return tables.get((name, version))

    def route(name: str, version: int) -> Table[Any]:
        """The local table whose topic routes keys of ``name`` version ``version``: that
        version's, else the lowest declared here (versions of a table share a topic)."""
        return tables.get((name, version)) or lowest_of[name]

    def _name(request: web.Request) -> str:
        name = request.match_info["table"]
        if name not in lowest_of:
            raise _Answer(error(404, f"no table named {name!r}", tables=names()))
        return name

    def _version(request: web.Request, name: str) -> int:
        """The version to answer ``name`` from: pinned by ``?version=N``, else the active
        one (an _Answer: 404 for a version that does not exist, 503 while unknown)."""
        current = routes.current()
        known = current.known
        existing = current.existing.get(name, ())
        if request.query.get("version"):
            version = _int_param(request, "version", 0)
            if version in existing:
                return version
            if FORWARDED in request.headers and not known:  # the asker knows it: not here yet
                raise _Answer(
                    unavailable(
                        f"version {version} of table {name!r} is not known here yet",
                        table_version=version,
                    ),
                    version,
                )
            raise _Answer(
                error(
                    404,
                    f"table {name!r} has no version {version}; its versions: "
                    f"{', '.join(map(str, existing)) or 'none'}",
                    versions=list(existing),
                )
            )
        latched = assignment.served.get(name)
        if latched is None:
            if not known:
                lowest = min(existing, default=None)
                raise _Answer(
                    unavailable(
                        f"the members directory is not read yet: which version of table "
                        f"{name!r} the group answers from is not known",
                    ),
                    lowest,
                )
            raise _Answer(error(404, f"table {name!r} has no version left (every one is retired)"))
        return latched

    def _serving(
        name: str,
        version: int,
        key: str,
        request: web.Request | None = None,
        *,
        stale_ok: bool = False,
    ) -> tuple[int, PartitionTables, Table[Any], str]:
        """The live lane of ``version`` owning ``key`` (its partition, committed tables,
        table and phase), or an _Answer (421, 503, or, given ``request``, the owner's
        answer to it, forwarded). A lapsed lease is 503 unless ``stale_ok``."""
        routing = route(name, version)
        partition, task = owner_of(routing.label, key)
        if task is None and assignment.rebalancing:
            raise _Answer(
                unavailable(
                    f"the group is rebalancing; partition {partition} of {name!r} has no owner yet",
                    partition=partition,
                ),
                version,
            )
        if (
            task is None
            and request is not None
            and assignment.directory is not None
            and FORWARDED not in request.headers  # never forward twice
        ):
            owner = assignment.remote_owner(routing.label, partition)
            if owner is None:
                raise _Answer(
                    unavailable(
                        f"the owner of partition {partition} of {name!r} is not known yet",
                        partition=partition,
                    ),
                    version,
                )
            raise _Forward(owner, partition)
        if task is None:
            raise _Answer(
                error(
                    421,
                    f"partition {partition} of table {name!r} is not owned by this worker",
                    partition=partition,
                ),
                version,
            )
        table = local(name, version)
        if table is None:
            raise _Answer(
                unavailable(
                    f"partition {partition} of table {name!r} version {version} is not live "
                    f"here: this worker's code declares version(s) "
                    f"{', '.join(str(t.version) for _, t in declared.values() if t.name == name)}",
                    partition=partition,
                ),
                version,
            )
        # serving_tables() and phase_of(), the lane looked up once
        lane = lane_of(task, table)
        phase = task.phase if lane is None else lane_phase(task, lane)
        if lane is None or lane.tables is None or phase is not Phase.LIVE:
            raise _Answer(
                unavailable(
                    f"partition {partition} of table {table.label!r} is {phase.value}",
                    partition=partition,
                    phase=phase.value,
                ),
                version,
            )
        _confirmed(partition, version, stale_ok)
        return partition, lane.tables, table, phase.value

    def _confirmed(partition: int, version: int | None, stale_ok: bool) -> float | None:
        """For how long this worker's ownership has not been confirmed (None: the owner's
        lease holds); an _Answer (503) when it has not and ``stale_ok`` is not given."""
        gap = assignment.unconfirmed()
        if gap is not None and not stale_ok:
            why = f"ownership of partition {partition} not confirmed for {gap:.1f} s"
            raise _Answer(unavailable(why, partition=partition, phase=UNCONFIRMED), version)
        return gap

    async def get_key(request: web.Request) -> web.Response:
        version: int | None = None
        try:
            name = _name(request)
            key = request.match_info["key"]
            _check_length("key", key)
            min_version = _int_param(request, "min_version", 0)
            meta = _flag(request, "meta")
            stale_ok = _flag(request, "stale_ok")
            version = _version(request, name)
            partition, ptables, table, phase = _serving(
                name, version, key, request, stale_ok=stale_ok
            )
            stream_version = ptables.committed_version(key)
            deadline = time.monotonic() + MIN_VERSION_WAIT_S
            while stream_version < min_version:
                if time.monotonic() >= deadline:
                    return versioned(
                        unavailable(
                            f"key {key!r} of table {name!r} is at stream version "
                            f"{stream_version}, not yet {min_version} "
                            f"(waited {MIN_VERSION_WAIT_S:.0f}s)",
                            partition=partition,
                            stream_version=stream_version,
                        ),
                        version,
                    )
                await asyncio.sleep(MIN_VERSION_POLL_S)
                # the partition may have moved, the lease lapsed meanwhile
                partition, ptables, table, phase = _serving(name, version, key, stale_ok=stale_ok)
                stream_version = ptables.committed_version(key)
            raw = ptables.store.get(table.data_space, key.encode())
            stale = _confirmed(partition, version, stale_ok)  # as of the read
        except _Answer as answer:
            return versioned(answer.response, answer.version)
        except _Forward as fwd:
            assert version is not None
            answered = await forward(
                request, fwd.owner, fwd.partition, MIN_VERSION_WAIT_S + 5, version=version
            )
            return versioned(answered, version)
        except StoreError as exc:
            return versioned(store_failed(name, partition, exc), version)
        checkpoint = ptables.checkpoint.live
        headers = {
            VERSION_HEADER: str(version),
            "X-Streamapp-Partition": str(partition),
            "X-Streamapp-Phase": phase,
            "X-Streamapp-Version": str(stream_version),
            "X-Streamapp-Checkpoint": "" if checkpoint is None else str(checkpoint),
        }
        if stale is not None:
            headers[STALE_HEADER] = f"{stale:.1f}"
        held_meta = held_answer(ptables, key, headers)  # a held stream says so
        if raw is None:
            resp = error(404, f"key {key!r} not found in table {table.label!r}")
            resp.headers.update(headers)
            return resp
        value = stored_answer(table, raw)
        if not meta:
            return json_response(value, 200, **headers)
        return json_response(
            {
                "table": name,
                "version": version,
                "key": key,
                "value": value,
                "partition": partition,
                "phase": phase,
                "stream_version": stream_version,
                "checkpoint": checkpoint,
                "store_position": ptables.checkpoint.history,
            }
            | held_meta,
            200,
            **headers,
        )

    async def scan_table(request: web.Request) -> web.Response:
        """Partition by partition, in key order: partitions owned here are read from the
        store, the others are asked of their owners (``only=P``, never forwarded twice),
        so any worker gives the whole table. ``cursor`` is (partition, last key)."""
        version: int | None = None
        try:
            name = _name(request)
            prefix = request.query.get("prefix", "")
            _check_length("prefix", prefix)
            limit = _int_param(request, "limit", SCAN_LIMIT)
            if not 1 <= limit <= SCAN_LIMIT_MAX:
                raise _Answer(error(400, f"limit must be between 1 and {SCAN_LIMIT_MAX}"))
            try:
                start_p, after = decode_cursor(request.query.get("cursor"))
            except ValueError:
                raise _Answer(error(400, "cursor is not one this worker gave")) from None
            version = _version(request, name)
            agent, _ = declared[route(name, version).label]
            count = agent.topic.partitions
            only = request.query.get("only")
            partitions = range(count) if only is None else [_int_param(request, "only", 0)]
            if only is not None and not 0 <= partitions[0] < count:
                raise _Answer(error(400, f"only must be a partition below {count}"))
            if assignment.rebalancing:
                raise _Answer(unavailable("the group is rebalancing"), version)
            items: list[dict[str, Any]] = []
            covered: list[int] = []
            cursor: str | None = None
            for p in partitions:
                if p < start_p:
                    continue
                want = limit - len(items)
                first = after if p == start_p else None
                got = await _page(request, name, version, p, prefix, first, want)
                if got is None:  # owners unknown on this transport: this worker's only
                    continue
                covered.append(p)
                items += got[:want]
                if len(got) > want or len(items) == limit:
                    cursor = encode_cursor(p, items[-1]["key"].encode())
                    break
        except _Answer as answer:
            return versioned(answer.response, answer.version)
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

    async def _page(
        request: web.Request,
        name: str,
        version: int,
        p: int,
        prefix: str,
        after: bytes | None,
        want: int,
    ) -> list[dict[str, Any]] | None:
        """Up to ``want`` + 1 items of partition ``p`` (one more: is there a next page?)."""
        routing = route(name, version)
        agent, _ = declared[routing.label]
        task = assignment.tasks.get((agent.topic.name, p))
        if task is not None:
            table = local(name, version)
            ptables = None if table is None else serving_tables(task, table)
            if table is None or ptables is None:
                phase = "not declared here" if table is None else phase_of(task, table).value
                raise _Answer(
                    unavailable(
                        f"partition {p} of table {name!r} version {version} is {phase}",
                        partition=p,
                        phase=phase,
                    ),
                    version,
                )
            stale = _confirmed(p, version, _flag(request, "stale_ok"))
            if stale is not None:  # the page's answer is marked (scan_table)
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
                raise _Answer(store_failed(name, p, exc), version) from exc
            return [
                {"key": k.decode(), "value": stored_answer(table, raw), "partition": p}
                for k, raw in rows
            ]
        if "only" in request.query or FORWARDED in request.headers:
            raise _Answer(
                error(421, f"partition {p} of table {name!r} is not owned here", partition=p)
            )
        if assignment.directory is None:
            return None
        owner = assignment.remote_owner(routing.label, p)
        if owner is None:
            raise _Answer(
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
        if _flag(request, "stale_ok"):
            query["stale_ok"] = "1"
        answer = await ask_owner(request, owner, f"/tables/{name}", query, p)
        if answer.status != 200 or answer.body is None:
            raise _Answer(answer, version)
        body = orjson.loads(answer.body)  # type: ignore[arg-type]
        return list(body["items"])

    # the key lookup first: aiohttp tries these routes in order (no two match a path)
    app.router.add_get("/tables/{table}/{key}", get_key)
    app.router.add_get("/tables/{table}", scan_table)
    app.router.add_get("/tables", listing(assignment, routes, table_names, route, history))


class _Answer(Exception):
    """An early answer (an error) out of a helper, and the table version it names."""

    def __init__(self, response: web.Response, version: int | None = None) -> None:
        super().__init__(response.status)
        self.response, self.version = response, version


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


def _flag(request: web.Request, name: str) -> bool:
    """Whether ``?name=`` is given as something other than empty, 0 or false."""
    return request.query.get(name, "") not in ("", "0", "false")


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
