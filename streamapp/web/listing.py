"""``GET /tables``: the app's tables, their versions and states, partition counts, and
which worker owns each partition (this one's with their phases)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..engine.assignment import Assignment
from ..engine.served import phase_of
from ..tables.table import Table
from .held import held_of_agent
from .responses import json_response
from .routes import VersionRoutes

Handler = Callable[[web.Request], Awaitable[web.Response]]


def listing(
    assignment: Assignment,
    routes: VersionRoutes,
    table_names: list[str],
    route: Callable[[str, int], Table[Any]],
    history: Callable[[], dict[str, object]] | None,
) -> Handler:
    """The handler of ``GET /tables``: ``table_names`` are the tables this worker's code
    declares, ``route(name, version)`` the local table whose topic routes that version."""

    async def list_tables(request: web.Request) -> web.Response:
        states, known = routes.states()
        head = (history() if history is not None else {}).get("head")
        out = []
        for name in sorted(set(table_names) | set(states)):
            table_states = states.get(name)
            active = None if table_states is None else table_states.active
            entry: dict[str, Any] = {"name": name, "active": active}
            if name in table_names:
                table = route(name, active or 0)
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

    return list_tables
