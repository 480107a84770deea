"""The table versions a key lookup may answer from, kept between requests.

:func:`streamapp.engine.served.group_states` combines this worker's lanes (every owned
partition's), the members directory, the retirements and this worker's latch
(``Assignment.served``), and advances the latch: too much work for every key asked.
:class:`VersionRoutes` keeps what a key lookup reads of it (each table's versions that
can be asked for, and whether the directory is read; the version answered stays the
latch's) with the inputs it came from, and computes it again through ``group_states`` as
soon as any of them differs: a partition assigned or revoked, a lane's phase or its
stores, a member's record (or, on RabbitMQ, a member timing out), a retirement learned,
the latch moved. A building version's progress is not among them: it changes no
version's state (``GET /tables``, which shows it, computes afresh with :meth:`states`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from ..engine.assignment import Assignment
from ..engine.served import TablesDirectory, group_states, retired_versions
from ..versions.states import TableStates


@dataclass(frozen=True, slots=True)
class Routes:
    """What key lookups read of the group's version states."""

    existing: Mapping[str, tuple[int, ...]]
    """Each table's versions that can be asked for (declared and not retired)."""
    known: bool
    """Whether the members directory is read (False: the other members are not known)."""


class VersionRoutes:
    """The group's version states as key lookups need them, computed again on any change
    of what they come from (see the module's docstring)."""

    def __init__(self, assignment: Assignment, worker: str) -> None:
        self.assignment, self.worker = assignment, worker
        self._inputs: tuple[Any, ...] | None = None
        """What :attr:`_routes` was computed from (None: nothing kept)."""
        self._routes = Routes({}, False)
        self._directory: object = None
        self._carries_tables = False

    def current(self) -> Routes:
        """The routes of the state as it is now."""
        before = self._read_inputs()
        if before == self._inputs:
            return self._routes
        states, known = group_states(self.assignment, self.worker)  # advances the latch
        self._routes = Routes({name: tuple(t.existing) for name, t in states.items()}, known)
        after = self._read_inputs()
        # kept only if nothing but the latch moved while computing (a member timing out)
        self._inputs = after if after[:-1] == before[:-1] else None
        return self._routes

    def states(self) -> tuple[dict[str, TableStates], bool]:
        """Every table's version states computed afresh, progress included, as
        :func:`~streamapp.engine.served.group_states` gives them (the latch advances)."""
        self._inputs = None  # the latch may move: the next lookup computes again
        return group_states(self.assignment, self.worker)

    def _read_inputs(self) -> tuple[Any, ...]:
        """What ``group_states`` reads, a building version's progress aside: the owned
        partitions' lanes (each one's agent, phase, and whether its stores are open), the
        retirements, the other members' records (None: not read yet) and, last, the latch."""
        assignment = self.assignment
        directory = assignment.directory
        if directory is not self._directory:  # a Protocol's isinstance is slow: once each
            self._directory = directory
            self._carries_tables = isinstance(directory, TablesDirectory)
        others = cast(TablesDirectory, directory).member_tables() if self._carries_tables else ()
        if others is not None:
            others = tuple(others)  # a copy: a directory may edit the list it gave
        # what local_tables() reads of a lane: which tables it writes (its agent's), its
        # phase, whether its stores are open; no partition's objects are held meanwhile
        lanes = [
            (key, lane.agent, lane.phase, lane.tables is None)
            for key, task in assignment.tasks.items()
            for lane in task.lanes
        ]
        return (lanes, retired_versions(assignment.app.id), others, dict(assignment.served))
