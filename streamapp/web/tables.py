"""Table endpoints: the app's tables, one key's value, a paginated scan, one view class
each (:class:`KeyEndpoint` here, :class:`~streamapp.web.scan.ScanEndpoint`,
:class:`~streamapp.web.listing.ListingEndpoint`) over one base,
:class:`~streamapp.web.endpoint.TableEndpoint` (the tables declared, the version
answered, the owner's lease, the query parameters).

Every answer comes from committed state (the store), never an open batch. A key whose
partition this worker owns but that is not live (restoring, catching up), or whose store
read failed (a corrupt block: the partition is rebuilt meanwhile), gets 503 with
Retry-After; a key of another worker's partition is forwarded to its owner when the
transport keeps a directory of owners (Kafka), else answered 421 naming the partition.

A table has versions (``Table(name, version=N)``); views answer from the table's active
version (:mod:`streamapp.versions.states`, as the members directory shows the group:
:func:`streamapp.engine.served.group_states`, kept between lookups until what it comes
from changes: :mod:`streamapp.web.versions`), or from the version ``?version=N`` pins.
Every answer to a key names the version that served it or would serve it, in the header
:data:`VERSION_HEADER` (200s, 404s of a key, 503s). A key is forwarded to its owner
with the version, and the owner answers that version, never another; a partition
whose lane of that version is not live answers 503 + Retry-After.

- ``GET /tables``: each table's versions, partition counts, owners (:mod:`.listing`).
- ``GET /tables/{table}/{key}``: the value, plain JSON (a key of another worker's
  partition is forwarded to it, :mod:`streamapp.web.owner`). ``?version=N`` pins a
  version (404 naming the versions that exist when N is none of them).
  ``?min_version=N`` waits up to :data:`MIN_VERSION_WAIT_S` for the key's committed
  stream version to reach N (else 503). ``?meta=1`` wraps the value with its table
  version, partition, phase, stream version and checkpoint; the same facts are in
  ``X-Streamapp-*`` headers of every answer.
- Past its owner's lease (:mod:`streamapp.engine.lease`) a key answers 503 (``ownership of
  partition N not confirmed for X s``); ``?stale_ok=1`` answers, marked :data:`STALE_HEADER`.
- ``?stale_ok=1`` on a worker that keeps a standby of the key's partition (setting
  ``standby_replicas``) and does not own it answers from the standby, marked
  :data:`STANDBY_HEADER` ``: true``, with its lag in :data:`LAG_HEADER` (records) and
  :data:`LAG_S_HEADER` (seconds since it was caught up), and under ``standby`` with
  ``?meta=1``. Without ``stale_ok`` a standby never answers.
- ``GET /tables/{table}?prefix=&limit=&cursor=``: the whole table (one version, as
  above), merged across the workers, in partition then key order, a page at a time
  (partitions of other workers are asked of their owners); ``cursor`` continues
  (:mod:`.scan`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ..engine.assignment import Assignment, StandbyCopy
from ..engine.lane import Lane
from ..engine.phase import Phase
from ..engine.served import lane_of, lane_phase
from ..engine.task import PartitionTask
from ..errors import StoreError
from ..tables.partition import PartitionTables
from ..tables.table import Table
from ..topics import Partitioner
from .endpoint import STALE_HEADER, TableEndpoint, answer_early, check_length, flag, int_param
from .explain import StoreFolds, folded_answer, wants_fold
from .held import held_answer
from .listing import ListingEndpoint
from .owner import FORWARDED, forward
from .responses import (
    VERSION_HEADER,
    error,
    json_response,
    store_failed,
    stored_answer,
    unavailable,
    versioned,
)
from .scan import ScanEndpoint
from .versions import VersionRoutes

__all__ = ["STALE_HEADER", "KeyEndpoint", "Serving", "add_routes"]

MIN_VERSION_WAIT_S = 5.0
"""How long ``?min_version=`` waits for the key's stream version."""
MIN_VERSION_POLL_S = 0.02
"""How often ``?min_version=`` looks at the key's stream version meanwhile."""
STANDBY_HEADER = "Streamapp-Stale"
"""``true`` on an answer from a standby copy (``?stale_ok=1``), never the owner's."""
LAG_HEADER = "Streamapp-Standby-Lag"
"""The changelog records the standby that answered had not applied."""
LAG_S_HEADER = "Streamapp-Standby-Lag-Seconds"
"""The seconds since the standby that answered was last caught up."""
PARTITION_CACHE_KEYS = 10_000
"""The partitions of this many keys asked lately are remembered (murmur2 in Python is
about 1.5 us a short key); past that the memory starts again, empty."""


def add_routes(
    app: web.Application,
    assignment: Assignment,
    worker_id: str = "",
    history: Callable[[], dict[str, object]] | None = None,
    folds: StoreFolds | None = None,
) -> None:
    """The three table endpoints of ``app``, sharing one :class:`VersionRoutes`;
    ``folds``: the app and event store ``?explain`` and ``?as_of`` fold with."""
    routes = VersionRoutes(assignment, worker_id)
    keys = KeyEndpoint(assignment, routes, folds)
    # the key lookup first: aiohttp tries the routes under /tables in this order (none
    # of the three matches another's paths)
    app.router.add_get("/tables/{table}/{key}", keys.dispatch)
    app.router.add_get("/tables/{table}", ScanEndpoint(assignment, routes).dispatch)
    app.router.add_get("/tables", ListingEndpoint(assignment, routes, history).dispatch)


@dataclass(frozen=True, slots=True)
class Serving:
    """The live lane answering a key: what a lookup reads and names in its answer."""

    partition: int
    """The key's partition."""
    lane: Lane | None
    """The lane of the asked version in the partition's task (live); None: a standby."""
    tables: PartitionTables
    """The lane's committed tables (the store, the checkpoint, the stream versions)."""
    table: Table[Any]
    """The table asked, of the version answered."""
    phase: str
    """The lane's phase as answers name it (``live``; ``standby`` for a standby)."""
    standby: StandbyCopy | None = None
    """The standby copy answering (``?stale_ok=1``), with its lag."""


class KeyEndpoint(TableEndpoint):
    """``GET /tables/{table}/{key}``: one key's committed value (see the module)."""

    def __init__(
        self,
        assignment: Assignment,
        routes: VersionRoutes,
        folds: StoreFolds | None = None,
    ) -> None:
        super().__init__(assignment, routes)
        self.folds = folds
        """The app and event store answers folded from the store use (:mod:`.explain`)."""
        self.topics = {label: agent.topic for label, (agent, _) in assignment.app.tables.items()}
        """Each table's topic, by the table's label."""
        self.partitions_of: dict[tuple[int, Partitioner], dict[str, int]] = {}
        """Per partition count and partitioner, the partitions of keys asked lately."""

    async def get(self, request: web.Request) -> web.Response:
        name = self.name(request)
        key = request.match_info["key"]
        check_length("key", key)
        min_version = int_param(request, "min_version", 0)
        meta = flag(request, "meta")
        stale_ok = flag(request, "stale_ok")
        version = self.version(request, name)
        if wants_fold(request):  # from the event store, never live state: no owner asked
            local = self.local(name, version)
            if local is None:
                why = f"table {name!r} version {version} is not declared by this worker's code"
                return versioned(error(404, f"{why}: a fold runs that version's handler"), version)
            return await folded_answer(request, self.folds, local, key)
        try:
            found = self.serving(name, version, key, request, stale_ok=stale_ok)
        except _Forward as fwd:
            answered = await forward(
                request, fwd.owner, fwd.partition, MIN_VERSION_WAIT_S + 5, version=version
            )
            return versioned(answered, version)
        try:
            stream_version = found.tables.committed_version(key)
            deadline = time.monotonic() + MIN_VERSION_WAIT_S
            while stream_version < min_version:
                if time.monotonic() >= deadline:
                    return versioned(
                        unavailable(
                            f"key {key!r} of table {name!r} is at stream version "
                            f"{stream_version}, not yet {min_version} "
                            f"(waited {MIN_VERSION_WAIT_S:.0f}s)",
                            partition=found.partition,
                            stream_version=stream_version,
                        ),
                        version,
                    )
                await asyncio.sleep(MIN_VERSION_POLL_S)
                # the partition may have moved, the lease lapsed meanwhile
                found = self.serving(name, version, key, stale_ok=stale_ok)
                stream_version = found.tables.committed_version(key)
            raw = found.tables.store.get(found.table.data_space, key.encode())
        except StoreError as exc:
            return versioned(store_failed(name, found.partition, exc), version)
        # as of the read; a standby is no owner: no lease of its own
        stale = None if found.standby else self.confirmed(found.partition, version, stale_ok)
        headers = self.headers(found, version, stream_version, stale)
        held_meta = held_answer(found.tables, key, headers)  # a held stream says so
        if raw is None:
            resp = error(404, f"key {key!r} not found in table {found.table.label!r}")
            resp.headers.update(headers)
            return resp
        value = stored_answer(found.table, raw)
        if not meta:
            return json_response(value, 200, **headers)
        return json_response(
            {
                "table": name,
                "version": version,
                "key": key,
                "value": value,
                "partition": found.partition,
                "phase": found.phase,
                "stream_version": stream_version,
                "checkpoint": found.tables.checkpoint.live,
                "store_position": found.tables.checkpoint.history,
            }
            | held_meta
            | _standby_meta(found.standby),
            200,
            **headers,
        )

    def headers(
        self, found: Serving, version: int, stream_version: int, stale: float | None
    ) -> dict[str, str]:
        """The headers of a key's answer (a value or a 404): the version answered, the
        partition, its phase, the key's stream version, the checkpoint, staleness."""
        checkpoint = found.tables.checkpoint.live
        headers = {
            VERSION_HEADER: str(version),
            "X-Streamapp-Partition": str(found.partition),
            "X-Streamapp-Phase": found.phase,
            "X-Streamapp-Version": str(stream_version),
            "X-Streamapp-Checkpoint": "" if checkpoint is None else str(checkpoint),
        }
        if stale is not None:
            headers[STALE_HEADER] = f"{stale:.1f}"
        if found.standby is not None:
            headers[STANDBY_HEADER] = "true"
            headers[LAG_HEADER] = str(found.standby.lag)
            headers[LAG_S_HEADER] = f"{found.standby.lag_s:.3f}"
        return headers

    def owner_of(self, label: str, key: str) -> tuple[int, PartitionTask | None]:
        """:meth:`Assignment.owner_of`, with the partitions of recent keys remembered."""
        topic = self.topics[label]
        known = self.partitions_of.setdefault((topic.partitions, topic.partitioner), {})
        partition = known.get(key)
        if partition is None:
            if len(known) >= PARTITION_CACHE_KEYS:
                known.clear()
            partition = known[key] = topic.partition_of(key.encode())
        return partition, self.assignment.tasks.get((topic.name, partition))

    def serving(
        self,
        name: str,
        version: int,
        key: str,
        request: web.Request | None = None,
        *,
        stale_ok: bool = False,
    ) -> Serving:
        """The live lane of ``version`` owning ``key``, or an early answer (421, 503), or,
        given ``request``, a :class:`_Forward` to the owner. A lapsed lease is 503 unless
        ``stale_ok``."""
        assignment = self.assignment
        routing = self.route(name, version)
        partition, task = self.owner_of(routing.label, key)
        if task is None and stale_ok and assignment.standbys is not None:
            standby = self._standby(name, version, partition)
            if standby is not None:
                return standby
        if task is None and assignment.rebalancing:
            answer_early(
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
                answer_early(
                    unavailable(
                        f"the owner of partition {partition} of {name!r} is not known yet",
                        partition=partition,
                    ),
                    version,
                )
            raise _Forward(owner, partition)
        if task is None:
            answer_early(
                error(
                    421,
                    f"partition {partition} of table {name!r} is not owned by this worker",
                    partition=partition,
                ),
                version,
            )
        table = self.local(name, version)
        if table is None:
            declared = assignment.app.tables.values()
            versions = ", ".join(str(t.version) for _, t in declared if t.name == name)
            answer_early(
                unavailable(
                    f"partition {partition} of table {name!r} version {version} is not live "
                    f"here: this worker's code declares version(s) {versions}",
                    partition=partition,
                ),
                version,
            )
        # serving_tables() and phase_of(), the lane looked up once
        lane = lane_of(task, table)
        phase = task.phase if lane is None else lane_phase(task, lane)
        if lane is None or lane.tables is None or phase is not Phase.LIVE:
            answer_early(
                unavailable(
                    f"partition {partition} of table {table.label!r} is {phase.value}",
                    partition=partition,
                    phase=phase.value,
                ),
                version,
            )
        self.confirmed(partition, version, stale_ok)
        return Serving(partition, lane, lane.tables, table, phase.value)

    def _standby(self, name: str, version: int, partition: int) -> Serving | None:
        """The standby copy of ``partition`` of table ``name`` (``version``) here, if any."""
        table = self.local(name, version)
        standbys = self.assignment.standbys
        if table is None or standbys is None:
            return None
        copy = standbys.copy(self.topics[table.label].name, partition, table.label)
        if copy is None:
            return None
        return Serving(partition, None, copy.tables, table, "standby", copy)


def _standby_meta(copy: StandbyCopy | None) -> dict[str, object]:
    """``?meta=1``'s ``standby`` field: the standby's lag (nothing from the owner)."""
    if copy is None:
        return {}
    return {"standby": {"lag": copy.lag, "lag_s": round(copy.lag_s, 3)}}


class _Forward(Exception):
    """Another worker owns the key's partition: ask it."""

    def __init__(self, owner: str, partition: int) -> None:
        super().__init__(owner)
        self.owner, self.partition = owner, partition
