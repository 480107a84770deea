"""What this worker owns right now: the ownership and status interface of views.

Transports fill it (a Kafka group assignment, RabbitMQ membership, the embedded store
source); the worker, the views and the status page read it, and know no transport.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

from ..agents.agent import Agent
from ..errors import TableUnavailableError
from ..tables.partition import PartitionTables
from ..tables.store import Store
from ..tables.table import Table
from .interfaces import Directory
from .lease import Lease
from .phase import Phase
from .stalled import PartitionStalls, Stalled, lag_seconds
from .task import PartitionTask


class Agents(Protocol):
    """What the assignment and the views read of the app: its id, its agents and which
    agent owns each table (:class:`streamapp.app.App` is one). The engine sits below
    the app, so it names what it needs instead of importing it."""

    @property
    def id(self) -> str: ...
    @property
    def agents(self) -> Mapping[str, Agent]: ...
    @property
    def tables(self) -> Mapping[str, tuple[Agent, Table[Any]]]: ...
    def agents_of(self, topic: str) -> list[Agent]: ...


@dataclass(frozen=True, slots=True)
class StandbyCopy:
    """A standby's copy of a partition's tables on this worker (setting
    ``standby_replicas``): never the owner's, answered only to ``?stale_ok=1``."""

    tables: PartitionTables
    lag: int
    """Changelog records it had not applied when last read."""
    lag_s: float
    """Seconds since it was last caught up (0: caught up)."""


class StandbyReads(Protocol):
    """A transport's standby replicas as views and ``/status`` read them (Kafka)."""

    def copy(self, topic: str, partition: int, table: str) -> StandbyCopy | None:
        """The checked standby copy of ``table``'s ``partition`` here (None: none)."""
        ...

    def status(self) -> dict[str, Any]:
        """Each standby partition's stores: position, lag in records and seconds."""
        ...


class Assignment:
    """The partition tasks of one worker, by (topic, partition)."""

    def __init__(self, app: Agents) -> None:
        self.app = app
        self.tasks: dict[tuple[str, int], PartitionTask] = {}
        self._rebalancing = True
        self._settled_at: float | None = None
        self.directory: Directory | None = None
        """Owners of the partitions of other workers (None: views do not forward)."""
        self.served: dict[str, int] = {}
        """The table version views answer each table from, by table name: one-way, it
        only moves up (unless that version is retired; :mod:`streamapp.engine.served`)."""
        self.lease: Lease | None = None
        """This worker's owner's lease, confirmed by its group (:mod:`.lease`); None: no
        group to confirm it (the embedded store lock holds while the process runs)."""
        self.standbys: StandbyReads | None = None
        """The standby replicas this worker keeps of other workers' partitions (None:
        the transport keeps none)."""
        self.stalls: PartitionStalls | None = None
        """The engine's watch of its live partitions (every transport): the stalled ones
        and the lag's lower bound (:mod:`streamapp.engine.stalled`); None: not watched."""
        self.stall_sources: list[Callable[[], Mapping[tuple[str, int], Stalled]]] = []
        """Who else finds stalled partitions: the transport, where it can tell (RabbitMQ:
        the broker gives the queue to another consumer,
        :mod:`streamapp.transports.rabbitmq.stalled`)."""

    @property
    def rebalancing(self) -> bool:
        """True from start (or a revocation) until the partitions are handed out."""
        return self._rebalancing

    @rebalancing.setter
    def rebalancing(self, value: bool) -> None:
        if self._rebalancing and not value:
            self._settled_at = time.monotonic()
        self._rebalancing = value

    def last_rebalance_s_ago(self) -> float | None:
        """How long ago the partitions were last handed out (None while a rebalance
        runs, or before the first ended): ``/status``, as Kafka's consumer metric
        ``last-rebalance-seconds-ago``; a fail-over is timed from it."""
        if self._rebalancing or self._settled_at is None:
            return None
        return time.monotonic() - self._settled_at

    def owner_of(self, table: str, key: str) -> tuple[int, PartitionTask | None]:
        """The partition of ``key`` in the table labelled ``table`` (``Table.label``), and
        its task if this worker owns it."""
        agent, _ = self.app.tables[table]
        partition = agent.topic.partition_of(key.encode())
        return partition, self.tasks.get((agent.topic.name, partition))

    def remote_owner(self, table: str, partition: int) -> str | None:
        """The views URL of the worker that owns ``partition`` of ``table``, if known."""
        if self.directory is None:
            return None
        agent, _ = self.app.tables[table]
        return self.directory.owner_url(agent.topic.name, partition)

    def read_store(self, table: Table[Any], partition: int) -> Store:
        """The committed store of ``partition`` of ``table`` on this worker, for an agent
        that reads it (a :data:`~streamapp.tables.reads.Locator`): served while its task
        is live; else TableUnavailableError (not owned here, restoring, catching up: the
        read waits rather than see a partial replay)."""
        return read_store(self.tasks, self.app, table, partition)

    def unconfirmed(self) -> float | None:
        """For how long the group has not confirmed this worker's ownership of its
        partitions, past ``owner_lease_s`` (None: the lease holds, or there is none)."""
        return None if self.lease is None else self.lease.unconfirmed_s()

    @property
    def ready(self) -> bool:
        """True when partitions are assigned, every one of them is live and the lease
        on them holds."""
        return (
            not self.rebalancing
            and all(t.phase is Phase.LIVE for t in self.tasks.values())
            and self.unconfirmed() is None
        )

    def not_confirmed(self) -> dict[str, str]:
        """The live partitions whose ownership the group has not confirmed within
        ``owner_lease_s``, each with why (empty while the lease holds)."""
        why = None if self.lease is None else self.lease.reason()
        if why is None:
            return {}
        return {
            task.name: why
            for _, task in sorted(self.tasks.items(), key=lambda kv: kv[0])
            if task.phase is Phase.LIVE
        }

    def not_live(self) -> dict[str, str]:
        """The assigned partitions that are not live yet, with their phase."""
        return {
            task.name: task.phase.value
            for _, task in sorted(self.tasks.items(), key=lambda kv: kv[0])
            if task.phase is not Phase.LIVE
        }

    def status(self) -> dict[str, Any]:
        """Each task's status with its lag in seconds (``lag_s``, and per agent); a live one
        whose lease lapsed is ``unconfirmed`` (see :data:`UNCONFIRMED`), with
        ``unconfirmed_s``; a stalled one is ``stalled`` (:data:`STALLED`), with
        ``stalled_s`` and what it was doing, ``stalled_doing``."""
        gap = self.unconfirmed()
        stalled = self.stalled()
        out: dict[str, Any] = {}
        for key, task in sorted(self.tasks.items(), key=lambda kv: kv[0]):
            status = task.status()
            lags = self.lag_seconds(key, task)
            status["lag_s"] = _rounded(lags.get(""))
            agents = cast("dict[str, dict[str, object]]", status["agents"])
            for name, lane in agents.items():
                lane["lag_s"] = _rounded(lags.get(name))
            if task.phase is Phase.LIVE and gap is not None:
                status |= {"phase": UNCONFIRMED, "unconfirmed_s": round(gap, 1)}
            elif key in stalled:
                seconds, doing = stalled[key]
                status |= {"phase": STALLED, "stalled_s": round(seconds, 1)}
                status["stalled_doing"] = doing
            out[task.name] = status
        return out

    def stalled(self) -> dict[tuple[str, int], Stalled]:
        """The live partitions that are stalled, by the engine's watch or the transport
        (one concept: :mod:`streamapp.engine.stalled`), each with for how long and what
        it was doing (the longer, when both say so)."""
        found: dict[tuple[str, int], Stalled] = {}
        sources = [*self.stall_sources, *([self.stalls.stalled] if self.stalls else [])]
        for source in sources:
            for key, stall in source().items():
                task = self.tasks.get(key)
                if task is None or task.phase is not Phase.LIVE:
                    continue
                if key not in found or found[key].seconds < stall.seconds:
                    found[key] = stall
        return found

    def stalled_count(self) -> int:
        """Live partitions that are stalled (see :meth:`stalled`)."""
        return len(self.stalled())

    def stalled_agents(self) -> dict[str, str]:
        """The agents every partition of which here is stalled, each with why (the
        longest-stalled partition's name and what it was doing): ``/readyz`` is 503."""
        stalled = self.stalled()
        if not stalled:
            return {}
        out: dict[str, str] = {}
        for name, agent in self.app.agents.items():
            keys = [k for k in self.tasks if k[0] == agent.topic.name]
            if keys and all(k in stalled for k in keys):
                key = max(keys, key=lambda k: stalled[k].seconds)
                seconds, doing = stalled[key]
                out[name] = (
                    f"all {len(keys)} partitions stalled (setting stall_after_s), "
                    f"{self.tasks[key].name} for {seconds:.0f}s: {doing}"
                )
        return out

    def lag_seconds(self, key: tuple[str, int], task: PartitionTask) -> dict[str, float]:
        """``task``'s lag in seconds (:func:`~streamapp.engine.stalled.lag_seconds`):
        under ``""`` the partition's, and each live agent's by name (none when unknown:
        not live yet)."""
        seen_s = self.stalls.seen_s(key, task) if self.stalls is not None else 0.0
        out: dict[str, float] = {}
        whole = lag_seconds(task, seen_s=seen_s)
        if whole is None:
            return out
        out[""] = whole
        for lane in task.lanes:
            if lane.next is not None:
                at_settle = lane.next == task.next_position
                lane_lag = lag_seconds(task, lane.next, seen_s if at_settle else 0.0)
                if lane_lag is not None:
                    out[lane.name] = lane_lag
        return out


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


class LiveSource(Protocol):
    """Feeds the app's agents: Kafka, RabbitMQ, or the event store alone."""

    assignment: Assignment
    """The partitions this worker owns now (views and status read it)."""

    async def start(self) -> None:
        """Connect, check that what the app needs exists, begin delivering."""

    async def stop(self) -> None:
        """Finish batches in hand, commit, close stores, disconnect."""

    async def wait(self) -> None:
        """Until the source ends; raises when it failed for good."""


STALLED = "stalled"
"""What ``/status`` says of a live partition that is stalled (:mod:`.stalled`: it has
events to apply and applied none for ``stall_after_s``; on RabbitMQ also: the broker gives
its queue to another consumer). Not a phase of the task."""

UNCONFIRMED = "unconfirmed"
"""What ``/status`` says of a live partition whose owner's lease lapsed: this worker may
have been cut off from its group, which may have moved the partition (its views answer
503 meanwhile). Not a phase of the task: the task does not know it."""


def read_store(
    tasks: dict[tuple[str, int], PartitionTask], app: Agents, table: Table[Any], partition: int
) -> Store:
    """``table``'s store of ``partition`` among ``tasks`` (see :meth:`Assignment.read_store`)."""
    owner, _ = app.tables[table.label]
    task = tasks.get((owner.topic.name, partition))
    if task is None:
        raise TableUnavailableError(
            f"table {table.label!r} partition {partition} is not owned by this worker (yet)"
        )
    tables = task.state.tables_for(table.label)
    if tables is None or task.phase is not Phase.LIVE:
        raise TableUnavailableError(
            f"table {table.label!r} partition {partition} is {task.phase.value} here"
        )
    return tables.store
