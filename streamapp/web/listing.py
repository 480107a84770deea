"""``GET /tables``: the app's tables, their versions and states, partition counts, and
which worker owns each partition (this one's with their phases)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from ..engine.assignment import Assignment
from ..engine.served import phase_of
from .endpoint import TableEndpoint
from .held import held_of_agent
from .responses import json_response
from .versions import VersionRoutes


class ListingEndpoint(TableEndpoint):
    """``GET /tables``: every table this worker's code declares or the group knows."""

    history: Callable[[], dict[str, object]] | None
    """The event store's reader status (its ``head``: how far a building version has
    to go), None without a history."""

    def __init__(
        self,
        assignment: Assignment,
        routes: VersionRoutes,
        history: Callable[[], dict[str, object]] | None,
    ) -> None:
        super().__init__(assignment, routes)
        self.history = history

    async def get(self, request: web.Request) -> web.Response:
        assignment = self.assignment
        states, known = self.routes.states()
        head = (self.history() if self.history is not None else {}).get("head")
        out = []
        for name in sorted(set(self.names) | set(states)):
            table_states = states.get(name)
            active = None if table_states is None else table_states.active
            entry: dict[str, Any] = {"name": name, "active": active}
            if name in self.lowest:
                table = self.route(name, active or 0)
                agent, _ = assignment.app.tables[table.label]
                owned = {
                    str(p): phase_of(task, table).value
                    for (topic, p), task in sorted(assignment.tasks.items())
                    if topic == agent.topic.name
                }
                entry |= {
                    "help": table.help,
                    "agent": agent.name,
                    "topic": agent.topic.name,
                    "partitions": agent.topic.partitions,
                    "owned": owned,
                    "held": held_of_agent(assignment, agent.name),
                    "owners": {
                        str(p): assignment.remote_owner(table.label, p)
                        for p in range(agent.topic.partitions)
                        if str(p) not in owned
                    },
                }
            versions = [] if table_states is None else [v.as_dict() for v in table_states.versions]
            for v in versions:
                if v["progress"] is not None:
                    v["progress"]["head"] = head
            entry["versions"] = versions
            out.append(entry)
        return json_response(
            {"rebalancing": assignment.rebalancing, "directory_read": known, "tables": out}
        )
