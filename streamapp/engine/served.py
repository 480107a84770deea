"""Which table versions this worker runs and answers from: its part of the members
directory, and the group's version states as its views see them.

A worker's record says which table versions its code declares and, for each, the
partitions whose lane of that version is live here (:func:`local_tables`), with the
version it answers each table from (``Assignment.served``: one-way, see
:mod:`streamapp.versions.states`). Views combine it with the other members' records
(a transport's directory implementing :class:`TablesDirectory`) in
:func:`group_states`, which advances that latch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import orjson

from ..tables.partition import PartitionTables
from ..tables.table import Table
from ..versions import retired, switched
from ..versions.states import (
    Declared,
    MemberTables,
    Progress,
    TableStates,
    TableVersion,
)
from ..versions.states import (
    group_states as states_of,
)
from .assignment import Agents, Assignment
from .lane import Lane
from .phase import Phase
from .task import PartitionTask

log = logging.getLogger("streamapp.views")

LATCH_FILE = "served-versions.json"
"""Where a worker keeps the versions it answers from: ``{data_dir}/{app}-`` this (beside
the app's store directory, which holds stores only)."""


class DurableLatch(dict[str, int]):
    """``Assignment.served`` kept in a file: a worker restarted (or killed) after its
    switch to v2 never answers from v1 again, even before it heard the other members.
    Written (atomically, synced) whenever a table's version changes; rare."""

    def __init__(self, path: Path) -> None:
        super().__init__(_read_latch(path))
        self.path = path

    def __setitem__(self, table: str, version: int) -> None:
        if self.get(table) != version:
            super().__setitem__(table, version)
            self._save()

    def pop(self, table: str, default: Any = None) -> Any:
        had = table in self
        value = super().pop(table, default)
        if had:
            self._save()
        return value

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            f.write(orjson.dumps(dict(self)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


def _read_latch(path: Path) -> dict[str, int]:
    try:
        raw = orjson.loads(path.read_bytes())
        return {str(t): int(v) for t, v in raw.items()}
    except FileNotFoundError:
        return {}
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
        log.warning("%s is not a file this streamapp wrote (%r): ignored", path, exc)
        return {}


@runtime_checkable
class TablesDirectory(Protocol):
    """A views directory that also carries the members' table versions."""

    def member_tables(self) -> Sequence[MemberTables] | None:
        """The other current members' table versions; None until the directory has
        read what the members wrote (views then answer only from a version already
        latched)."""
        ...


def lane_phase(task: PartitionTask, lane: Lane) -> Phase:
    """The phase of ``lane`` of ``task``: the one place views read a lane's phase (a
    lane building a new version is ``catching_up`` while its task is ``live``)."""
    return lane.phase


def retired_versions(app_id: str) -> frozenset[TableVersion]:
    """The table versions of ``app_id`` retired by ``streamapp retire``: the one place
    views read retirements (:mod:`streamapp.versions.retired`, filled from the app's ledger)."""
    return retired.retired_versions(app_id)


def table_versions(app: Agents) -> dict[TableVersion, Table[Any]]:
    """Every (name, version) ``app``'s code declares, with its Table."""
    return {(t.name, t.version): t for _, t in app.tables.values()}


def lane_of(task: PartitionTask, table: Table[Any]) -> Lane | None:
    """The lane of ``task`` that writes ``table`` (None: no agent of its topic does)."""
    return next((lane for lane in task.lanes if table in lane.agent.tables), None)


def serving_tables(task: PartitionTask, table: Table[Any]) -> PartitionTables | None:
    """``table``'s committed tables in ``task`` when its lane is live (else None)."""
    lane = lane_of(task, table)
    if lane is None or lane.tables is None or lane_phase(task, lane) is not Phase.LIVE:
        return None
    return lane.tables


def phase_of(task: PartitionTask, table: Table[Any]) -> Phase:
    """The phase of ``table``'s lane in ``task`` (the task's when no lane writes it)."""
    lane = lane_of(task, table)
    return task.phase if lane is None else lane_phase(task, lane)


def local_tables(assignment: Assignment, worker: str) -> MemberTables:
    """This worker's record of its table versions: each declared version, the owned
    partitions its lane has live, and how far the others' replay got."""
    declared = []
    for (name, version), table in sorted(table_versions(assignment.app).items()):
        agent, _ = assignment.app.tables[table.label]
        live: set[int] = set()
        building, positions = 0, []
        for (topic, partition), task in assignment.tasks.items():
            if topic != agent.topic.name:
                continue
            lane = lane_of(task, table)
            if lane is None:
                continue
            if lane.tables is not None and lane_phase(task, lane) is Phase.LIVE:
                live.add(partition)
            elif not lane_phase(task, lane).stopped:
                building += 1  # the last position it reached (0: none yet), never None
                positions.append(lane.history_position() - 1)
        progress = Progress(building, min(positions, default=None)) if building else None
        declared.append(
            Declared(
                name,
                version,
                agent.topic.partitions,
                frozenset(live),
                progress,
                manual=table.switch == "manual",
            )
        )
    return MemberTables(worker, tuple(declared), dict(assignment.served))


def old_declared(app: Agents, owned: frozenset[tuple[str, int]]) -> tuple[Declared, ...]:
    """What a record of an older streamapp (no table versions in it) declares: version 1
    of each table this app has, live on the partitions of its topic that it owns."""
    out = []
    for name in sorted({t.name for _, t in app.tables.values()}):
        agent = next(a for a, t in app.tables.values() if t.name == name)
        topic = agent.topic.name
        live = frozenset(p for t, p in owned if t == topic)
        out.append(Declared(name, 1, agent.topic.partitions, live))
    return tuple(out)


def group_states(assignment: Assignment, worker: str) -> tuple[dict[str, TableStates], bool]:
    """Every table's version states in the group, as this worker knows them, and whether
    the directory is read (False: the other members are not known yet). Advances this
    worker's latch (``Assignment.served``) to each table's active version."""
    directory: object = assignment.directory
    others: Sequence[MemberTables] | None = []
    if isinstance(directory, TablesDirectory):
        others = directory.member_tables()
    known = others is not None
    members = [local_tables(assignment, worker), *(others or [])]
    retired = retired_versions(assignment.app.id)
    switches = switched.switched_versions(assignment.app.id)
    states = states_of(members, retired, assignment.served, switches)
    if known:  # else a latched version only some unread member declares would be lost
        for name, table in states.items():
            if table.active is None:
                assignment.served.pop(name, None)
            else:
                assignment.served[name] = table.active
    return states, known
